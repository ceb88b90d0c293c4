// UniformKVCache: attention on uniform codes against the reference over the dequantized cache.
#include <gtest/gtest.h>

#include <cstring>

#include "attention_harness.h"
#include "core/error.h"
#include "kv/uniform_kv_cache.h"

namespace turbokv {
namespace {

using testing::AttentionCase;

TEST(UniformAttention, EveryIsaMatchesReferenceOnDequantizedCache) {
  const UniformKVConfig configs[] = {{4, 4, 64}, {2, 3, 32}, {3, 4, 128}, {8, 8, 64}, {4, 2, 32}};
  uint32_t seed = 300;
  size_t config_index = 0;
  for (const AttentionCase& c : testing::attention_cases()) {
    const UniformKVConfig& config = configs[config_index++ % std::size(configs)];
    const auto in = testing::make_inputs(c, seed++);
    UniformKVCache cache(c.kv_heads, c.head_dim, config);
    cache.append(in.k.data(), in.v.data(), static_cast<int>(c.n_tokens()));
    const DenseKVCache dequantized = cache.to_dense();
    auto expected = testing::output_buffer(c);
    auto expected_lse = testing::lse_buffer(c);
    const AttentionQueries queries{in.q.data(), c.n_q, c.n_past};
    attention_reference(dequantized.view(), queries, c.params(), expected.data(),
                        expected_lse.data());
    for (AttentionIsa isa : {AttentionIsa::kScalar, AttentionIsa::kAvx2}) {
      auto got = testing::output_buffer(c);
      auto got_lse = testing::lse_buffer(c);
      attention_uniform(cache.view(), queries, c.params(), got.data(), isa, got_lse.data());
      const std::string backend = "uniform K" + std::to_string(config.key_bits) + " V" +
                                  std::to_string(config.value_bits) + " g" +
                                  std::to_string(config.group_size) +
                                  (isa == AttentionIsa::kAvx2 ? " avx2" : " scalar");
      testing::expect_attention_close(c, expected, got, 1e-4, backend);
      testing::expect_lse_close(c, expected_lse, got_lse, 1e-4, backend);
    }
  }
}

TEST(UniformKVCache, NbytesAndErrors) {
  UniformKVCache cache(8, 128, {4, 4, 64});
  EXPECT_EQ(cache.bytes_per_token_head(), 2u * (64 + 2 * 2 * 2));  // codes + (scale, min) x 2
  const auto kv = testing::random_normal(size_t(10) * 8 * 128, 1);
  cache.append(kv.data(), kv.data(), 10);
  EXPECT_EQ(cache.nbytes(), 10u * 8 * 144);
  EXPECT_THROW(UniformKVCache(8, 128, {9, 4, 64}), InvalidArgument);
  EXPECT_THROW(UniformKVCache(8, 128, {4, 4, 48}), InvalidArgument);
}

TEST(UniformKVCache, Append16Then1EqualsAppend17Bitwise) {
  const int kv_heads = 2, d = 64, heads = 4;
  const size_t row = size_t(kv_heads) * d;
  const auto k = testing::random_normal(17 * row, 2);
  const auto v = testing::random_normal(17 * row, 3);
  const auto q = testing::random_normal(size_t(heads) * d, 4);
  UniformKVCache a(kv_heads, d, {4, 4, 32}), b(kv_heads, d, {4, 4, 32});
  a.append(k.data(), v.data(), 16);
  a.append(k.data() + 16 * row, v.data() + 16 * row, 1);
  b.append(k.data(), v.data(), 17);
  std::vector<float> out_a(heads * d), out_b(heads * d);
  a.attend(q.data(), 1, AttentionParams{heads, 0.125f, 0, 0}, out_a.data());
  b.attend(q.data(), 1, AttentionParams{heads, 0.125f, 0, 0}, out_b.data());
  EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * 4), 0);
}

}  // namespace
}  // namespace turbokv
