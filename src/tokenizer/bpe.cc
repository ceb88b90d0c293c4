// BPE model (see bpe.h).
#include "tokenizer/bpe.h"

#include <cstdio>
#include <queue>

#include "core/error.h"
#include "core/utf8.h"
#include "tokenizer/pipeline.h"

namespace turbokv {

BpeModel::BpeModel(const json& model) {
  const json& vocab = json_member(model, "vocab", "model");
  if (!vocab.is_object()) throw FormatError("tokenizer.json: model.vocab must be an object");
  int32_t max_id = -1;
  vocab_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      throw FormatError(str_cat("tokenizer.json: model.vocab[\"", token,
                                "\"] must be a non-negative integer id, got ", id.dump()));
    }
    vocab_.emplace(token, id.get<int32_t>());
    max_id = std::max(max_id, id.get<int32_t>());
  }
  // id_to_token_ is indexed by id: gaps cost an empty string each, so an id far past the
  // vocab's size (a 1 KB file naming id 2^31 - 1) would allocate gigabytes.
  constexpr int64_t kMaxUnusedIds = int64_t(1) << 20;
  if (int64_t(max_id) + 1 > int64_t(vocab_.size()) + kMaxUnusedIds) {
    throw FormatError(str_cat("tokenizer.json: model.vocab id ", max_id, " is far past its ",
                              vocab_.size(), " entries (at most ", kMaxUnusedIds,
                              " unused ids below the largest)"));
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_token_.assign(id_to_token_.size(), false);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token;
    has_token_[id] = true;
  }

  auto optional_string = [&](const char* key) -> std::string {
    return model.contains(key) && model[key].is_string() ? model[key].get<std::string>() : "";
  };
  continuing_prefix_ = optional_string("continuing_subword_prefix");
  end_suffix_ = optional_string("end_of_word_suffix");
  auto flag = [&](const char* key) {
    return model.contains(key) && model[key].is_boolean() && model[key].get<bool>();
  };
  byte_fallback_ = flag("byte_fallback");
  fuse_unk_ = flag("fuse_unk");
  ignore_merges_ = flag("ignore_merges");
  if (const std::string unk = optional_string("unk_token"); !unk.empty()) {
    auto it = vocab_.find(unk);
    if (it == vocab_.end()) {
      throw FormatError(str_cat("tokenizer.json: model.unk_token '", unk, "' is not in the vocab"));
    }
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(std::string_view(name));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  // Merges: "a b" strings (older files) or [a, b] pairs; rank = position in the list.
  const json& merges = json_member(model, "merges", "model");
  if (!merges.is_array()) throw FormatError("tokenizer.json: model.merges must be an array");
  size_t slots = 16;
  while (slots < 2 * merges.size()) slots *= 2;
  merge_slots_.assign(slots, MergeSlot{});
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& entry = merges[rank];
    std::string left, right;
    if (entry.is_string()) {
      const std::string text = entry.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        throw FormatError(str_cat("tokenizer.json: model.merges[", rank, "] '", text,
                                  "' must be two tokens separated by one space"));
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      throw FormatError(str_cat("tokenizer.json: model.merges[", rank,
                                "] must be \"a b\" or [\"a\", \"b\"], got ", entry.dump()));
    }
    std::string merged = left;
    merged += !continuing_prefix_.empty() && right.starts_with(continuing_prefix_)
                  ? right.substr(continuing_prefix_.size())
                  : right;
    auto a = vocab_.find(left), b = vocab_.find(right), m = vocab_.find(merged);
    if (a == vocab_.end() || b == vocab_.end() || m == vocab_.end()) {
      throw FormatError(str_cat("tokenizer.json: model.merges[", rank, "] (", left, " + ", right,
                                ") uses a token that is not in the vocab"));
    }
    insert_merge(pair_key(a->second, b->second), Merge{static_cast<int32_t>(rank), m->second});
  }
}

void BpeModel::insert_merge(uint64_t key, Merge merge) {
  const size_t mask = merge_slots_.size() - 1;
  for (size_t i = slot_of(key, mask);; i = (i + 1) & mask) {
    if (merge_slots_[i].key == key) return;  // a repeated pair keeps its first (lowest) rank
    if (merge_slots_[i].key == kEmptyKey) {
      merge_slots_[i] = {key, merge};
      return;
    }
  }
}

const BpeModel::Merge* BpeModel::find_merge(int32_t a, int32_t b) const {
  const uint64_t key = pair_key(a, b);
  const size_t mask = merge_slots_.size() - 1;
  for (size_t i = slot_of(key, mask);; i = (i + 1) & mask) {
    const MergeSlot& slot = merge_slots_[i];
    if (slot.key == key) return &slot.merge;
    if (slot.key == kEmptyKey) return nullptr;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= id_limit() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (!cache_enabled_ || piece.size() > kCacheMaxPieceBytes) {
    encode_piece_uncached(piece, ids);
    return;
  }
  {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = ids.size();
  encode_piece_uncached(piece, ids);
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() < kCacheCapacity) {
    cache_.try_emplace(std::string(piece), ids.begin() + static_cast<ptrdiff_t>(start), ids.end());
  }
}

void BpeModel::encode_piece_uncached(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(piece)) {
      ids.push_back(*id);
      return;
    }
  }
  // Doubly linked list of symbols over the piece; a merged-away symbol has len 0.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  bool previous_unk = false;
  std::string scratch;
  auto add = [&](int32_t id, uint32_t len) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1, len});
    if (index > 0) symbols[index - 1].next = index;
  };
  for (size_t pos = 0; pos < piece.size();) {
    const size_t begin = pos;
    utf8::next(piece, pos);
    std::string_view ch = piece.substr(begin, pos - begin);
    const bool first = begin == 0, last = pos == piece.size();
    std::optional<int32_t> id;
    if (continuing_prefix_.empty() && end_suffix_.empty()) {
      id = token_to_id(ch);
    } else {
      scratch.assign(first ? "" : continuing_prefix_).append(ch).append(last ? end_suffix_ : "");
      id = token_to_id(scratch);
    }
    if (id) {
      add(*id, static_cast<uint32_t>(ch.size()));
      previous_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (const char c : ch)
        all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all_bytes) {
        for (const char c : ch) add(byte_ids_[static_cast<unsigned char>(c)], 1);
        previous_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (fuse_unk_ && previous_unk) {
        symbols.back().len += static_cast<uint32_t>(ch.size());
      } else {
        add(*unk_id_, static_cast<uint32_t>(ch.size()));
      }
      previous_unk = true;
    }
  }

  struct Candidate {
    int32_t pos, rank, new_id;
    bool operator<(const Candidate& other) const {  // max-heap: lowest rank, then lowest pos
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({static_cast<int32_t>(i), m->rank, m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.len == 0 || current.next < 0) continue;
    const int32_t next_pos = current.next;
    const Symbol right = symbols[next_pos];
    const Merge* m = find_merge(current.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    current.id = top.new_id;
    current.len += right.len;
    current.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (current.prev >= 0) {
      if (const Merge* pm = find_merge(symbols[current.prev].id, current.id)) {
        queue.push({current.prev, pm->rank, pm->new_id});
      }
    }
    if (current.next >= 0) {
      if (const Merge* nm = find_merge(current.id, symbols[current.next].id)) {
        queue.push({top.pos, nm->rank, nm->new_id});
      }
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.len > 0) ids.push_back(symbol.id);
  }
}

}  // namespace turbokv
