// Automatic prefix cache: the KV of completed prompts (and of generated tokens), kept in blocks
// of block_tokens tokens so that a later request whose prompt starts with the same tokens, under
// the same KV settings, skips prefilling them.
//
// Keys. Block i of a sequence covers tokens [i·B, (i+1)·B). Its key chains the key of block
// i - 1 with the block's tokens, so a key stands for every token up to the block's end. The
// chain starts at a root: the KV settings (the write_state() record of a fresh set of caches:
// cache kinds, shapes, bits, seed, dtypes, every configuration field) and the cache state the
// rows were coded under. Only full blocks are kept and shared. Hash collisions cannot mix
// blocks up: a node matches only if its parent node and its tokens are the ones looked for.
//
// Exactness. A cache's rows depend on its state, which may be estimated from the first tokens
// it saw (KVCache::calibration_tokens(): a split codec's channel order ranked on the first
// chunk, a quantized_kv_start conversion). The scheduler feeds every prompt in chunks aligned
// to multiples of its chunk size C, so two sequences sharing their first S tokens (S a multiple
// of C) fixed the same state. A root therefore records S and those S tokens; a hit needs the
// new prompt to share them and restores at least S tokens. Caches whose state was fixed
// elsewhere (at the end of a prompt shorter than its chunk, during decode) are not shared.
// With that, a request served from the cache computes what it would have computed without it,
// up to the rounding of a different chunk split (a token's K/V computed in another chunk of
// the same values, or in a decode step).
//
// Memory. Shared: a block's rows (KVRows, one per layer) are immutable and referenced by the
// cache alone; every hit reads them. Copied: on insertion, each new full block's rows are copied
// out of the sequence's caches once (KVCache::copy_rows); on a hit, the blocks' rows are copied
// into the new sequence's own contiguous caches (KVCache::append_rows), a memory copy of the
// stored codes, never a prefill. So a cached prefix costs its stored size once in the cache
// (TurboQuant 3.5 codes: about 0.23 of fp16 for a quantized layer), plus a private copy in each
// sequence using it while that sequence runs. A paged GPU cache implements copy_rows as a
// reference to its physical blocks and append_rows as block-table entries, and then shares
// instead of copying (see KVCache::copy_rows).
//
// Eviction: least recently used first, leaves before their parents, under capacity_bytes.
// Everything here runs on the engine thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache.h"

namespace turbokv {

struct PrefixCacheStats {
  int64_t lookups = 0;        // requests that looked for a cached prefix
  int64_t hits = 0;           // ... and restored one
  int64_t hit_tokens = 0;     // prompt tokens restored instead of prefilled
  int64_t evictions = 0;      // blocks evicted to stay under the capacity
  int64_t blocks = 0;         // blocks held now
  int64_t tokens = 0;         // tokens held now (blocks x block_tokens)
  size_t bytes = 0;           // memory held now: rows, states and token ids
  size_t bytes_dense = 0;     // fp16 K/V of the same tokens, for comparison
  size_t capacity_bytes = 0;  // the budget
};

class PrefixCache {
 public:
  // block_tokens >= 16; chunk_tokens: the scheduler's prefill chunk (see Exactness above).
  PrefixCache(size_t capacity_bytes, int block_tokens, int chunk_tokens,
              std::vector<LayerSpec> layers);
  ~PrefixCache();

  // The settings key of caches that hold no tokens yet: their write_state() records. nullopt
  // when a cache type cannot be copied (its sequences bypass the prefix cache).
  static std::optional<std::string> settings_of(const LayerCaches& fresh);

  // Restores into fresh caches (made for settings, no tokens yet) the longest cached prefix of
  // tokens that is at most max_tokens long. Returns the tokens restored (0: none; the caches
  // are untouched then).
  int64_t restore(const std::string& settings, std::span<const int32_t> tokens, int64_t max_tokens,
                  LayerCaches& caches);

  // Copies the full blocks of the caches (which hold tokens[0, size)) that are not cached yet,
  // then evicts down to the capacity. Caches whose state cannot be shared are skipped.
  void insert(const std::string& settings, std::span<const int32_t> tokens,
              const LayerCaches& caches);

  // Caches in a bounded device pool (the GPU's): every stored block is promised to the pool
  // (reserve; false: older blocks make room, else the block is not kept) and given back when
  // evicted (release), so stored blocks and running requests never take more than the pool.
  void set_pool(std::function<bool(size_t)> reserve, std::function<void(size_t)> release) {
    pool_reserve_ = std::move(reserve);
    pool_release_ = std::move(release);
  }
  // Evicts the least recently used block; false when none is held.
  bool evict_oldest();
  size_t pooled_bytes() const { return pooled_bytes_; }  // promised to the pool now

  int block_tokens() const { return block_tokens_; }
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Root;
  struct Node;

  Root* find_root(const std::string& settings, int64_t calibration,
                  std::span<const int32_t> tokens) const;
  Node* find_child(const Root& root, const Node* parent, uint64_t parent_key,
                   std::span<const int32_t> block) const;
  void touch(Node& node);
  void evict_one();
  void drop_root(Root* root);

  size_t capacity_;
  int block_tokens_;
  int chunk_tokens_;
  std::vector<LayerSpec> layers_;
  uint64_t clock_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Root>> roots_;
  std::unordered_map<uint64_t, std::unique_ptr<Node>> nodes_;
  std::map<std::string, std::map<int64_t, int>> spans_;  // settings -> calibration -> roots
  std::set<std::pair<uint64_t, Node*>> leaves_;          // (last use, node): eviction order
  PrefixCacheStats stats_;
  std::function<bool(size_t)> pool_reserve_;
  std::function<void(size_t)> pool_release_;
  size_t pooled_bytes_ = 0;
};

}  // namespace turbokv
