// The BPE model of tokenizer.json: vocabulary, ranked merges, byte fallback, unk handling and
// a per-piece cache. encode_piece() follows HF tokenizers' Word::merge_all exactly (a heap of
// candidate merges ordered by rank, then position), including its stale-entry rule.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace turbokv {

class BpeModel {
 public:
  // model: the "model" object of tokenizer.json (type BPE). Throws FormatError naming the
  // bad entry (e.g. a merge whose parts are not in the vocabulary).
  explicit BpeModel(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized piece.
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  // The same without the cache: the slow reference the cache is checked against.
  void encode_piece_uncached(std::string_view piece, std::vector<int32_t>& ids) const;
  void set_cache_enabled(bool enabled) { cache_enabled_ = enabled; }

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr when id is not in the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find_merge(int32_t a, int32_t b) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;  // [id_limit], empty for ids not in the vocab
  std::vector<bool> has_token_;
  // Open-addressing table of merges keyed by pair_key (linear probing, load <= 1/2): the
  // hottest lookup of plain BPE.
  struct MergeSlot {
    uint64_t key = kEmptyKey;
    Merge merge{};
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};
  static size_t slot_of(uint64_t key, size_t mask) {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
  }
  void insert_merge(uint64_t key, Merge merge);
  std::vector<MergeSlot> merge_slots_;  // [power of two]
  std::optional<int32_t> unk_id_;
  std::string continuing_prefix_, end_suffix_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> token ids, -1 where absent

  bool cache_enabled_ = true;
  static constexpr size_t kCacheCapacity = 1 << 17;
  static constexpr size_t kCacheMaxPieceBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace turbokv
