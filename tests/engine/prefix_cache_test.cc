// The prefix cache on real caches: a hit restores exactly the first blocks another sequence
// coded, the longest usable prefix wins, only full blocks are shared, a state fixed by the
// first chunk is matched on those tokens, settings never mix, and LRU eviction keeps the cache
// under its budget.
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "kv/cache_policy.h"
#include "kv/kv_resolve.h"
#include "tests/common/random.h"

namespace turbokv {
namespace {

constexpr int kBlock = 16, kChunk = 32;
const std::vector<LayerSpec> kLayers = {{2, 32, 0}, {2, 32, 0}};
constexpr int kRow = 2 * 32;

ResolvedKV kv_of(std::optional<double> bits, const std::string& scheme = "turboquant",
                 std::optional<double> key_bits = {}) {
  KVOptions o;
  o.kv_bits = bits;
  o.kv_key_bits = key_bits;
  o.kv_quant_scheme = scheme;
  o.last_layer_dense = false;
  return resolve_kv_options(o);
}

// K/V of a token: a pure function of its id and position, as a model's would be of the prefix.
std::vector<float> kv_rows(const std::vector<int32_t>& tokens, int first, int n, int which) {
  std::vector<float> rows;
  for (int i = first; i < first + n; ++i) {
    const auto row =
        testing::random_normal(kRow, uint32_t(tokens[size_t(i)] * 7919 + i * 31 + which));
    rows.insert(rows.end(), row.begin(), row.end());
  }
  return rows;
}

// Feeds tokens[from, to) in chunks aligned to multiples of kChunk, as the scheduler does.
void feed(LayerCaches& caches, const std::vector<int32_t>& tokens, int from, int to) {
  for (int first = from; first < to;) {
    const int n = std::min(to - first, kChunk - first % kChunk);
    for (auto& cache : caches) {
      const auto k = kv_rows(tokens, first, n, 0), v = kv_rows(tokens, first, n, 1);
      cache->append(k.data(), v.data(), n);
    }
    first += n;
  }
}

std::vector<float> attend(const LayerCaches& caches) {
  const auto q = testing::random_normal(size_t(2) * 4 * 32, 5);
  std::vector<float> out;
  for (const auto& cache : caches) {
    std::vector<float> o(q.size());
    cache->attend(q.data(), 2, AttentionParams{4, 0.17f, 0, 0}, o.data());
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

std::vector<int32_t> sequence(int n, int32_t seed) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) tokens.push_back((seed * 131 + i * 17) % 1000);
  return tokens;
}

struct Fixture {
  explicit Fixture(size_t capacity = size_t(64) << 20) : cache(capacity, kBlock, kChunk, kLayers) {}
  PrefixCache cache;

  // A sequence that prefills tokens, then hands its caches to the prefix cache.
  void serve(const ResolvedKV& kv, const std::vector<int32_t>& tokens) {
    LayerCaches caches = make_layer_caches(kLayers, kv);
    const std::string settings = *PrefixCache::settings_of(make_layer_caches(kLayers, kv));
    const int64_t restored = cache.restore(settings, tokens, int64_t(tokens.size()) - 1, caches);
    feed(caches, tokens, int(restored), int(tokens.size()));
    cache.insert(settings, tokens, caches);
  }

  // Restores the prompt's cached prefix, prefills the rest, and checks the caches equal a cold
  // prefill of the whole prompt. Returns the tokens restored.
  int64_t check(const ResolvedKV& kv, const std::vector<int32_t>& prompt) {
    const std::string settings = *PrefixCache::settings_of(make_layer_caches(kLayers, kv));
    LayerCaches warm = make_layer_caches(kLayers, kv);
    const int64_t restored = cache.restore(settings, prompt, int64_t(prompt.size()) - 1, warm);
    feed(warm, prompt, int(restored), int(prompt.size()));
    LayerCaches cold = make_layer_caches(kLayers, kv);
    feed(cold, prompt, 0, int(prompt.size()));
    for (size_t l = 0; l < cold.size(); ++l) {
      EXPECT_EQ(warm[l]->size(), cold[l]->size());
      EXPECT_EQ(warm[l]->nbytes(), cold[l]->nbytes());
    }
    const auto a = attend(warm), b = attend(cold);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << restored << " tokens restored";
    return restored;
  }
};

TEST(PrefixCache, AHitRestoresTheFullBlocksOfTheSharedPrefixExactly) {
  for (const ResolvedKV& kv : {kv_of({}), kv_of(3.5), kv_of(4, "uniform")}) {
    Fixture f;
    const auto a = sequence(100, 1);
    f.serve(kv, a);
    // Diverges in the middle of block 3 (tokens 48..63): blocks 0..2 are shared.
    auto b = a;
    b.resize(70);
    b[55] = 999;
    EXPECT_EQ(f.check(kv, b), 48);
    // The whole of a, and more: every full block of a, not its last token.
    auto c = a;
    c.push_back(5);
    EXPECT_EQ(f.check(kv, c), 96);
    EXPECT_EQ(f.check(kv, a), 96);  // the last prompt token is always prefilled
    // Another beginning: nothing.
    EXPECT_EQ(f.check(kv, sequence(80, 2)), 0);
    EXPECT_EQ(f.cache.stats().hits, 3);
    EXPECT_EQ(f.cache.stats().hit_tokens, 48 + 96 + 96);
  }
}

TEST(PrefixCache, TheLongestChainOfTwoSequencesIsUsed) {
  Fixture f;
  const auto a = sequence(64, 3);
  auto b = a;
  for (int i = 40; i < 64; ++i) b[size_t(i)] = 7;  // shares 40 tokens with a
  f.serve(kv_of(3.5), a);
  f.serve(kv_of(3.5), b);  // restores 32 of a's, adds its own blocks 2 and 3
  EXPECT_EQ(f.cache.stats().blocks, 4 + 2);
  auto c = b;
  c.push_back(1);
  EXPECT_EQ(f.check(kv_of(3.5), c), 64);
}

TEST(PrefixCache, SettingsNeverMix) {
  Fixture f;
  const auto a = sequence(80, 4);
  f.serve(kv_of(3.5), a);
  EXPECT_EQ(f.check(kv_of(4, "uniform"), a), 0);
  EXPECT_EQ(f.check(kv_of({}), a), 0);
  KVOptions seed;
  seed.kv_bits = 3.5;
  seed.seed = 9;
  seed.last_layer_dense = false;
  EXPECT_EQ(f.check(resolve_kv_options(seed), a), 0);
  EXPECT_EQ(f.check(kv_of(3.5), a), 64);
}

TEST(PrefixCache, AStateRankedOnTheFirstChunkIsSharedOnlyWithThatChunk) {
  const ResolvedKV split = kv_of(3.5, "turboquant", 3.5);  // split keys: channel order ranking
  Fixture f;
  const auto a = sequence(100, 5);
  f.serve(split, a);  // state fixed by its first chunk, tokens 0..31
  auto same_chunk = a;
  same_chunk.resize(80);
  same_chunk[70] = 3;
  EXPECT_EQ(f.check(split, same_chunk), 64);
  // Shares two blocks but not the whole first chunk: its own first chunk ranks otherwise.
  auto other_chunk = a;
  other_chunk[20] = 3;
  EXPECT_EQ(f.check(split, other_chunk), 0);
  // A prompt shorter than a chunk fixes the state at its end: never shared.
  Fixture g;
  const auto short_prompt = sequence(20, 6);
  g.serve(split, short_prompt);
  EXPECT_EQ(g.cache.stats().blocks, 0);
}

TEST(PrefixCache, EvictionKeepsTheBudgetLeastRecentlyUsedFirst) {
  Fixture probe;
  probe.serve(kv_of(3.5), sequence(64, 7));
  const size_t per_sequence = probe.cache.stats().bytes;  // 4 blocks and a root
  Fixture f(per_sequence * 2 + per_sequence / 2);
  const auto a = sequence(65, 8), b = sequence(65, 9), c = sequence(65, 10);
  f.serve(kv_of(3.5), a);
  f.serve(kv_of(3.5), b);
  EXPECT_EQ(f.check(kv_of(3.5), a), 64);  // a is now the most recently used
  f.serve(kv_of(3.5), c);                 // evicts b's blocks, not a's
  EXPECT_LE(f.cache.stats().bytes, f.cache.stats().capacity_bytes);
  EXPECT_GT(f.cache.stats().evictions, 0);
  EXPECT_EQ(f.check(kv_of(3.5), a), 64);
  EXPECT_LT(f.check(kv_of(3.5), b), 64);
  EXPECT_EQ(f.check(kv_of(3.5), c), 64);
  const auto& s = f.cache.stats();
  EXPECT_EQ(s.tokens, s.blocks * kBlock);
  EXPECT_EQ(s.bytes_dense, size_t(s.tokens) * 2 * 2 * 32 * 2 * 2);
}

TEST(PrefixCache, APromptLargerThanTheBudgetKeepsTheBlocksThatFit) {
  Fixture probe;
  probe.serve(kv_of(3.5), sequence(32, 12));
  const size_t two_blocks = probe.cache.stats().bytes;  // and the root
  Fixture f(two_blocks + two_blocks / 4);
  f.serve(kv_of(3.5), sequence(40, 13));  // an older entry, evicted to make room
  const auto big = sequence(200, 14);
  f.serve(kv_of(3.5), big);
  EXPECT_LE(f.cache.stats().bytes, f.cache.stats().capacity_bytes);
  EXPECT_EQ(f.cache.stats().blocks, 2);
  EXPECT_EQ(f.check(kv_of(3.5), big), 32);
  Fixture tiny(16);  // not even the root and one block: nothing is kept
  tiny.serve(kv_of(3.5), big);
  EXPECT_EQ(tiny.cache.stats().blocks, 0);
  EXPECT_EQ(tiny.cache.stats().bytes, 0u);
}

TEST(PrefixCache, QuantizedBlocksCostAFractionOfDenseOnes) {
  Fixture dense, tq;
  const auto a = sequence(256, 11);
  dense.serve(kv_of({}), a);
  tq.serve(kv_of(3.5), a);
  EXPECT_EQ(dense.cache.stats().tokens, 256);
  EXPECT_EQ(tq.cache.stats().tokens, 256);
  // K3/V4 at d = 32: (12 + 16 code bytes + 2 norms each) / 128 fp16 bytes, plus token ids.
  EXPECT_LT(double(tq.cache.stats().bytes), 0.35 * double(dense.cache.stats().bytes));
}

TEST(PrefixCache, ABlockOfFewerThan16TokensIsRefused) {
  EXPECT_THROW(PrefixCache(1 << 20, 8, kChunk, kLayers), InvalidArgument);
}

}  // namespace
}  // namespace turbokv
