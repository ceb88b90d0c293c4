// The prefix cache's index (roots, hash-chained block nodes, LRU leaves) and its copies in and
// out of a sequence's caches (see prefix_cache.h).
#include "engine/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "kv/byte_io.h"

namespace turbokv {
namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  uint64_t s = h ^ (v * 0x9E3779B97F4A7C15ull);
  return splitmix64_next(&s);
}

uint64_t hash_tokens(uint64_t h, std::span<const int32_t> tokens) {
  for (int32_t t : tokens) h = mix(h, static_cast<uint32_t>(t));
  return mix(h, tokens.size());
}

uint64_t hash_bytes(const std::string& bytes) {
  uint64_t h = 0x243F6A8885A308D3ull;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = mix(h, word);
  }
  for (; i < bytes.size(); ++i) h = mix(h, static_cast<uint8_t>(bytes[i]));
  return mix(h, bytes.size());
}

bool same_tokens(std::span<const int32_t> a, std::span<const int32_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

// The start of a chain: the KV settings, plus the cache state and the first `calibration`
// tokens that fixed it (none when the rows depend on each token alone).
struct PrefixCache::Root {
  uint64_t key = 0;
  std::string settings;                     // write_state() of fresh caches
  int64_t calibration = 0;                  // KVCache::calibration_tokens() of the source
  std::vector<int32_t> calibration_tokens;  // [calibration] the tokens that fixed the state
  std::vector<std::string> states;          // [layers] write_state() of the source caches
  size_t bytes = 0;
  int children = 0;  // first blocks under this root
};

// One full block: tokens [end - B, end) of every sequence whose first `end` tokens are those of
// its chain.
struct PrefixCache::Node {
  uint64_t key = 0;
  Root* root = nullptr;
  Node* parent = nullptr;                           // nullptr: the first block
  std::vector<int32_t> tokens;                      // [block_tokens]
  std::vector<std::shared_ptr<const KVRows>> rows;  // [layers]
  int64_t end = 0;
  size_t bytes = 0;
  bool pooled = false;  // bytes promised to the device pool (set_pool)
  int children = 0;
  uint64_t last_use = 0;
};

PrefixCache::PrefixCache(size_t capacity_bytes, int block_tokens, int chunk_tokens,
                         std::vector<LayerSpec> layers)
    : capacity_(capacity_bytes),
      block_tokens_(block_tokens),
      chunk_tokens_(chunk_tokens),
      layers_(std::move(layers)) {
  if (block_tokens < 16) {
    throw InvalidArgument(str_cat("prefix cache block of ", block_tokens, " tokens: at least 16"));
  }
  if (chunk_tokens < 1) {
    throw InvalidArgument(str_cat("prefix cache: chunk of ", chunk_tokens, " tokens"));
  }
  stats_.capacity_bytes = capacity_bytes;
}

PrefixCache::~PrefixCache() = default;

std::optional<std::string> PrefixCache::settings_of(const LayerCaches& fresh) {
  ByteWriter out;
  try {
    for (const auto& cache : fresh) cache->write_state(out);
  } catch (const Unsupported&) {
    return std::nullopt;
  }
  return std::string(out.buffer().begin(), out.buffer().end());
}

PrefixCache::Root* PrefixCache::find_root(const std::string& settings, int64_t calibration,
                                          std::span<const int32_t> tokens) const {
  const auto first = tokens.first(size_t(calibration));
  const uint64_t key = hash_tokens(mix(hash_bytes(settings), uint64_t(calibration)), first);
  const auto it = roots_.find(key);
  if (it == roots_.end()) return nullptr;
  Root* root = it->second.get();
  if (root->settings != settings || root->calibration != calibration ||
      !same_tokens(root->calibration_tokens, first)) {
    return nullptr;
  }
  return root;
}

PrefixCache::Node* PrefixCache::find_child(const Root& root, const Node* parent,
                                           uint64_t parent_key,
                                           std::span<const int32_t> block) const {
  const auto it = nodes_.find(hash_tokens(parent_key, block));
  if (it == nodes_.end()) return nullptr;
  Node* node = it->second.get();
  if (node->root != &root || node->parent != parent || !same_tokens(node->tokens, block)) {
    return nullptr;
  }
  return node;
}

void PrefixCache::touch(Node& node) {
  if (node.children == 0) leaves_.erase({node.last_use, &node});
  node.last_use = ++clock_;
  if (node.children == 0) leaves_.insert({node.last_use, &node});
}

int64_t PrefixCache::restore(const std::string& settings, std::span<const int32_t> tokens,
                             int64_t max_tokens, LayerCaches& caches) {
  ++stats_.lookups;
  const auto spans = spans_.find(settings);
  if (spans == spans_.end()) return 0;
  const int64_t B = block_tokens_;
  max_tokens = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  Root* best_root = nullptr;
  std::vector<Node*> best;
  for (const auto& [calibration, count] : spans->second) {
    if (calibration > max_tokens) break;
    Root* root = find_root(settings, calibration, tokens);
    if (root == nullptr) continue;
    std::vector<Node*> chain;
    uint64_t key = root->key;
    const Node* parent = nullptr;
    for (int64_t end = B; end <= max_tokens; end += B) {
      Node* node = find_child(*root, parent, key, tokens.subspan(size_t(end - B), size_t(B)));
      if (node == nullptr) break;
      chain.push_back(node);
      parent = node;
      key = node->key;
    }
    const int64_t matched = static_cast<int64_t>(chain.size()) * B;
    if (matched >= calibration && chain.size() > best.size()) {
      best = std::move(chain);
      best_root = root;
    }
  }
  if (best.empty()) return 0;
  for (size_t l = 0; l < caches.size(); ++l) {
    const std::string& state = best_root->states[l];
    ByteReader in(reinterpret_cast<const uint8_t*>(state.data()), state.size());
    caches[l]->read_state(in);
    for (const Node* node : best) caches[l]->append_rows(*node->rows[l]);
  }
  for (Node* node : best) touch(*node);
  const int64_t restored = static_cast<int64_t>(best.size()) * B;
  ++stats_.hits;
  stats_.hit_tokens += restored;
  return restored;
}

void PrefixCache::insert(const std::string& settings, std::span<const int32_t> tokens,
                         const LayerCaches& caches) {
  if (caches.size() != layers_.size() || caches.empty()) return;
  const int64_t held = caches.front()->size();
  int64_t calibration = 0;
  for (const auto& cache : caches) {
    if (cache->size() != held) return;
    calibration = std::max(calibration, cache->calibration_tokens());
  }
  const int64_t B = block_tokens_;
  const int64_t blocks = std::min<int64_t>(held, static_cast<int64_t>(tokens.size())) / B;
  // A state fixed by anything but whole aligned chunks of the prompt cannot be matched exactly.
  if (blocks == 0 || calibration > blocks * B ||
      (calibration > 0 && calibration % chunk_tokens_ != 0)) {
    return;
  }
  std::vector<std::string> states;
  for (const auto& cache : caches) {
    ByteWriter out;
    cache->write_state(out);
    states.emplace_back(out.buffer().begin(), out.buffer().end());
  }
  Root* root = find_root(settings, calibration, tokens);
  if (root == nullptr) {
    auto fresh = std::make_unique<Root>();
    fresh->key = hash_tokens(mix(hash_bytes(settings), uint64_t(calibration)),
                             tokens.first(size_t(calibration)));
    if (roots_.count(fresh->key) != 0) return;  // a colliding key: leave these blocks out
    fresh->settings = settings;
    fresh->calibration = calibration;
    fresh->calibration_tokens.assign(tokens.begin(), tokens.begin() + calibration);
    fresh->states = std::move(states);
    fresh->bytes = fresh->calibration_tokens.size() * sizeof(int32_t);
    for (const auto& s : fresh->states) fresh->bytes += s.size();
    root = fresh.get();
    stats_.bytes += root->bytes;
    ++spans_[settings][calibration];
    roots_.emplace(root->key, std::move(fresh));
  } else if (root->states != states) {
    return;  // the same tokens fixed another state: not a cache this key can stand for
  }

  Node* parent = nullptr;
  uint64_t key = root->key;
  const uint64_t root_key = root->key;
  const uint64_t insert_start = clock_ + 1;  // nodes of this chain are used from here on
  for (int64_t end = B; end <= blocks * B; end += B) {
    const auto block = tokens.subspan(size_t(end - B), size_t(B));
    Node* node = find_child(*root, parent, key, block);
    if (node == nullptr) {
      const uint64_t node_key = hash_tokens(key, block);
      if (nodes_.count(node_key) != 0) break;  // a colliding key: stop this chain here
      auto fresh = std::make_unique<Node>();
      fresh->key = node_key;
      fresh->root = root;
      fresh->parent = parent;
      fresh->tokens.assign(block.begin(), block.end());
      fresh->end = end;
      fresh->bytes = size_t(B) * sizeof(int32_t);
      for (const auto& cache : caches) {
        fresh->rows.push_back(cache->copy_rows(end - B, B));
        fresh->bytes += fresh->rows.back()->nbytes();
      }
      node = fresh.get();
      if (parent != nullptr) {
        if (parent->children++ == 0) leaves_.erase({parent->last_use, parent});
      } else {
        ++root->children;
      }
      nodes_.emplace(node_key, std::move(fresh));
      node->last_use = ++clock_;
      leaves_.insert({node->last_use, node});
      stats_.bytes += node->bytes;
      ++stats_.blocks;
      stats_.tokens += B;
      // Older blocks make room (in the capacity, and in the device pool when there is one);
      // when only this chain is left, the chain stops here.
      auto fits = [&] {
        if (stats_.bytes > capacity_) return false;
        if (pool_reserve_ && !node->pooled && pool_reserve_(node->bytes)) {
          node->pooled = true;
          pooled_bytes_ += node->bytes;
        }
        return node->pooled || !pool_reserve_;
      };
      while (!fits() && leaves_.begin()->first < insert_start) evict_one();
      if (!fits()) {
        evict_one();  // the block just added: the only leaf left
        break;
      }
    } else {
      touch(*node);
    }
    parent = node;
    key = node->key;
  }
  if (const auto it = roots_.find(root_key); it != roots_.end() && it->second->children == 0) {
    drop_root(it->second.get());  // not one block of it could be kept
  }
  while (stats_.bytes > capacity_ && !leaves_.empty()) evict_one();
  stats_.bytes_dense = 0;
  for (const auto& l : layers_) {
    stats_.bytes_dense += size_t(l.kv_heads) * l.head_dim * 2 /*K,V*/ * 2 /*fp16*/;
  }
  stats_.bytes_dense *= static_cast<size_t>(stats_.tokens);
}

bool PrefixCache::evict_oldest() {
  if (leaves_.empty()) return false;
  evict_one();
  return true;
}

void PrefixCache::evict_one() {
  Node* node = leaves_.begin()->second;
  leaves_.erase(leaves_.begin());
  if (node->pooled) {
    pooled_bytes_ -= node->bytes;
    if (pool_release_) pool_release_(node->bytes);
  }
  stats_.bytes -= node->bytes;
  --stats_.blocks;
  stats_.tokens -= block_tokens_;
  ++stats_.evictions;
  Node* parent = node->parent;
  Root* root = node->root;
  nodes_.erase(node->key);
  if (parent != nullptr) {
    if (--parent->children == 0) leaves_.insert({parent->last_use, parent});
  } else if (--root->children == 0) {
    drop_root(root);
  }
}

void PrefixCache::drop_root(Root* root) {
  auto spans = spans_.find(root->settings);
  if (--spans->second[root->calibration] == 0) spans->second.erase(root->calibration);
  if (spans->second.empty()) spans_.erase(spans);
  stats_.bytes -= root->bytes;
  roots_.erase(root->key);
}

}  // namespace turbokv
