// TurboQuantKVCache: attention on codes against the reference over the dequantized cache
// (shared harness cases, scalar and AVX2), exact nbytes, append/trim invariants.
#include <gtest/gtest.h>

#include <cstring>

#include "attention_harness.h"
#include "core/error.h"
#include "kv/turboquant_kv_cache.h"

namespace turbokv {
namespace {

using testing::AttentionCase;

// Bit widths cycled over the cases: integer, one split tensor, both split, low and high bits.
const TurboQuantKVConfig kConfigs[] = {
    {3, 4, 0, true}, {3.5, 4, 1, true}, {2.5, 3.5, 2, false}, {4, 4, 3, true},
    {2, 3, 4, true}, {1, 2, 5, true},   {5, 6, 6, true},
};

TEST(TurboQuantAttention, EveryIsaMatchesReferenceOnDequantizedCache) {
  const testing::ScopedCodeProducts exact(CodeProducts::kExact);
  uint32_t seed = 100;
  size_t config_index = 0;
  for (const AttentionCase& c : testing::attention_cases()) {
    if (c.head_dim < 4) continue;
    const TurboQuantKVConfig& config = kConfigs[config_index++ % std::size(kConfigs)];
    const auto in = testing::make_inputs(c, seed++);
    TurboQuantKVCache cache(c.kv_heads, c.head_dim, config);
    // Past and chunk appended separately, as a prefill followed by the chunk under test.
    const size_t row = size_t(c.kv_heads) * c.head_dim;
    if (c.n_past > 0) cache.append(in.k.data(), in.v.data(), static_cast<int>(c.n_past));
    cache.append(in.k.data() + c.n_past * row, in.v.data() + c.n_past * row, c.n_q);
    const DenseKVCache dequantized = cache.to_dense();
    auto expected = testing::output_buffer(c);
    auto expected_lse = testing::lse_buffer(c);
    attention_reference(dequantized.view(), AttentionQueries{in.q.data(), c.n_q, c.n_past},
                        c.params(), expected.data(), expected_lse.data());
    const std::string name =
        "turboquant K" + std::to_string(config.key_bits) + " V" + std::to_string(config.value_bits);
    for (AttentionIsa isa : testing::kAllIsas) {
      auto got = testing::output_buffer(c);
      auto got_lse = testing::lse_buffer(c);
      attention_turboquant(cache.view(), AttentionQueries{in.q.data(), c.n_q, c.n_past}, c.params(),
                           got.data(), isa, got_lse.data());
      const std::string backend = name + " " + attention_isa_name(isa);
      testing::expect_attention_close(c, expected, got, 1e-4, backend);
      testing::expect_lse_close(c, expected_lse, got_lse, 1e-4, backend);
    }
    auto via_cache = testing::output_buffer(c);
    cache.attend(in.q.data(), c.n_q, c.params(), via_cache.data());
    testing::expect_attention_close(c, expected, via_cache, 1e-4, name + " attend()");
  }
}

// The first S tokens attended densely, the rest on codes (a view of a token range), merged by
// their softmax statistics: equal to attention over the whole dequantized cache.
TEST(TurboQuantAttention, TokenRangePartialMergesWithADensePart) {
  const testing::ScopedCodeProducts exact(CodeProducts::kExact);
  const AttentionCase c{128, 2, 4, 700, 1};
  const int64_t first_part = 4;
  const auto in = testing::make_inputs(c, 77);
  for (const TurboQuantKVConfig& config : {kConfigs[0], kConfigs[1]}) {
    TurboQuantKVCache cache(c.kv_heads, c.head_dim, config);
    cache.append(in.k.data(), in.v.data(), static_cast<int>(c.n_tokens()));
    const DenseKVCache dequantized = cache.to_dense();
    const AttentionQueries queries{in.q.data(), c.n_q, c.n_past};
    auto expected = testing::output_buffer(c);
    auto expected_lse = testing::lse_buffer(c);
    attention_reference(dequantized.view(), queries, c.params(), expected.data(),
                        expected_lse.data());
    DenseKVView head = dequantized.view();
    head.n_tokens = first_part;
    TurboQuantKVView rest = cache.view();
    const quant::TurboQuantCodec& key_codec = *rest.keys.codecs[0];
    const quant::TurboQuantCodec& value_codec = *rest.values.codecs[0];
    rest.keys.codes += first_part * key_codec.code_bytes();
    rest.keys.norms += first_part * key_codec.norms_per_vector();
    rest.values.codes += first_part * value_codec.code_bytes();
    rest.values.norms += first_part * value_codec.norms_per_vector();
    rest.n_tokens -= first_part;
    rest.first_pos = first_part;
    for (AttentionIsa isa : testing::kAllIsas) {
      auto a = testing::output_buffer(c), b = testing::output_buffer(c);
      auto lse_a = testing::lse_buffer(c), lse_b = testing::lse_buffer(c);
      attention_dense(head, queries, c.params(), a.data(), isa, lse_a.data());
      attention_turboquant(rest, queries, c.params(), b.data(), isa, lse_b.data());
      merge_attention_partials(a.data(), lse_a.data(), b.data(), lse_b.data(),
                               int64_t(c.n_q) * c.n_heads(), c.head_dim, a.data(), lse_a.data());
      const std::string name = std::string("dense + turboquant ") + attention_isa_name(isa);
      testing::expect_attention_close(c, expected, a, 1e-4, name);
      testing::expect_lse_close(c, expected_lse, lse_a, 1e-4, name);
    }
  }
}

TEST(TurboQuantKVCache, NbytesIs116PerTokenPerHeadAtD128Bits35) {
  TurboQuantKVCache cache(8, 128, {3, 4, 0, true});  // keys 3 bits, values 4 bits
  EXPECT_EQ(cache.bytes_per_token_head(), 116u);     // 48 + 2 + 64 + 2
  const auto kv = testing::random_normal(size_t(300) * 8 * 128, 5);
  cache.append(kv.data(), kv.data(), 300);
  EXPECT_EQ(cache.nbytes(), 300u * 8 * 116);
  EXPECT_LE(116.0 / (2 * 2 * 128), 0.23);  // vs fp16 K and V
  // Split 3.5 on keys: 64 channels at 4 bits + 64 at 3 bits + two norms = 60 bytes; values 66;
  // the channel orders add 2 bytes per channel per KV head (once per layer).
  TurboQuantKVCache split(8, 128, {3.5, 4, 0, true});
  split.append(kv.data(), kv.data(), 300);
  EXPECT_EQ(split.bytes_per_token_head(), 126u);
  EXPECT_EQ(split.nbytes(), 300u * 8 * 126 + 2 * 8 * 128);
}

TEST(TurboQuantKVCache, Append16Then1EqualsAppend17Bitwise) {
  for (const TurboQuantKVConfig& config : kConfigs) {
    const int kv_heads = 2, d = 128, heads = 8;
    const auto k = testing::random_normal(size_t(40) * kv_heads * d, 7);
    const auto v = testing::random_normal(size_t(40) * kv_heads * d, 8);
    const auto q = testing::random_normal(size_t(heads) * d, 9);
    TurboQuantKVCache a(kv_heads, d, config), b(kv_heads, d, config);
    // The split channel order comes from the first chunk: give both the same first chunk.
    a.append(k.data(), v.data(), 23);
    b.append(k.data(), v.data(), 23);
    const size_t row = size_t(kv_heads) * d;
    a.append(k.data() + 23 * row, v.data() + 23 * row, 16);
    a.append(k.data() + 39 * row, v.data() + 39 * row, 1);
    b.append(k.data() + 23 * row, v.data() + 23 * row, 17);
    std::vector<float> out_a(heads * d), out_b(heads * d);
    const AttentionParams params{heads, 0.088f, 0, 0};
    a.attend(q.data(), 1, params, out_a.data());
    b.attend(q.data(), 1, params, out_b.data());
    EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * 4), 0);
    EXPECT_EQ(a.nbytes(), b.nbytes());
  }
}

TEST(TurboQuantKVCache, TrimThenAppendEqualsNeverAppended) {
  const int kv_heads = 2, d = 64, heads = 4;
  const size_t row = size_t(kv_heads) * d;
  const auto k = testing::random_normal(60 * row, 17);
  const auto v = testing::random_normal(60 * row, 18);
  const auto junk = testing::random_normal(9 * row, 19);
  const auto q = testing::random_normal(size_t(3) * heads * d, 20);
  TurboQuantKVCache trimmed(kv_heads, d, {3.5, 2.5, 1, true}),
      clean(kv_heads, d, {3.5, 2.5, 1, true});
  trimmed.append(k.data(), v.data(), 50);
  trimmed.append(junk.data(), junk.data(), 9);
  trimmed.trim(9);
  trimmed.append(k.data() + 50 * row, v.data() + 50 * row, 10);
  clean.append(k.data(), v.data(), 50);
  clean.append(k.data() + 50 * row, v.data() + 50 * row, 10);
  std::vector<float> out_t(3 * heads * d), out_c(3 * heads * d);
  const AttentionParams params{heads, 0.125f, 0, 0};
  trimmed.attend(q.data(), 3, params, out_t.data());
  clean.attend(q.data(), 3, params, out_c.data());
  EXPECT_EQ(std::memcmp(out_t.data(), out_c.data(), out_t.size() * 4), 0);
  EXPECT_EQ(trimmed.nbytes(), clean.nbytes());
}

TEST(TurboQuantKVCache, ConvertFromDenseEqualsQuantizingDirectly) {
  const int kv_heads = 2, d = 128;
  const auto k = testing::random_normal(size_t(70) * kv_heads * d, 30);
  const auto v = testing::random_normal(size_t(70) * kv_heads * d, 31);
  DenseKVCache dense(kv_heads, d, KVDType::kF32);
  dense.append(k.data(), v.data(), 70);
  const TurboQuantKVConfig config{3, 4, 0, true};
  auto converted = TurboQuantKVCache::convert_from(dense, config);
  TurboQuantKVCache direct(kv_heads, d, config);
  direct.append(k.data(), v.data(), 70);
  ASSERT_EQ(converted->size(), 70);
  for (int h = 0; h < kv_heads; ++h) {
    EXPECT_EQ(std::memcmp(converted->key_rows().codes(h, 0), direct.key_rows().codes(h, 0),
                          70 * direct.key_rows().code_bytes()),
              0);
  }
}

TEST(TurboQuantKVCache, BadBitsAreInvalidArgument) {
  EXPECT_THROW(TurboQuantKVCache(2, 128, {2.25, 4, 0, true}), InvalidArgument);
  EXPECT_THROW(TurboQuantKVCache(2, 128, {3, 9, 0, true}), InvalidArgument);
  EXPECT_THROW(TurboQuantKVCache(0, 128, {3, 4, 0, true}), InvalidArgument);
  TurboQuantKVCache cache(2, 64, {3, 4, 0, true});
  std::vector<float> kv(3 * 64);
  EXPECT_THROW(cache.append_checked(kv.data(), kv.data(), 1, 3, 64), InvalidArgument);
}

}  // namespace
}  // namespace turbokv
