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

namespace turbokv {
namespace {

TEST(UniformHadamard, AttendMatchesReferenceOnDequantizedCache) {
  uint32_t seed = 900;
  for (const testing::AttentionCase& c : testing::attention_cases()) {
    const auto in = testing::make_inputs(c, seed++);
    const UniformKVConfig config{int(2 + seed % 3), 4, 32, true, 5};
    UniformKVCache cache(c.kv_heads, c.head_dim, config);
    cache.append(in.k.data(), in.v.data(), static_cast<int>(c.n_tokens()));
    const DenseKVCache dequantized = cache.to_dense();
    auto expected = testing::output_buffer(c);
    attention_reference(dequantized.view(), AttentionQueries{in.q.data(), c.n_q, c.n_past},
                        c.params(), expected.data());
    auto got = testing::output_buffer(c);
    cache.attend(in.q.data(), c.n_q, c.params(), got.data());
    testing::expect_attention_close(c, expected, got, 2e-4, "uniform + hadamard");
  }
}

TEST(UniformHadamard, CodesAreTheGroupsOfTheRotatedVector) {
  const int kv_heads = 2, d = 128, n = 5;
  const auto k = testing::random_normal(size_t(n) * kv_heads * d, 910);
  const auto v = testing::random_normal(size_t(n) * kv_heads * d, 911);
  UniformKVCache cache(kv_heads, d, {3, 4, 64, true, 7});
  cache.append(k.data(), v.data(), n);
  const quant::UniformCodec codec({d, 3, 64});
  const auto rotation = quant::Rotation::get(7, d, quant::RotationRole::kKey);
  std::vector<float> rotated(d);
  std::vector<uint8_t> codes(codec.code_bytes());
  std::vector<uint16_t> params(size_t(codec.params_per_vector()));
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < kv_heads; ++h) {
      rotation->apply(&k[(size_t(t) * kv_heads + h) * d], rotated.data());
      codec.quantize(rotated.data(), codes.data(), params.data());
      EXPECT_EQ(std::memcmp(codes.data(), cache.key_rows().codes(h, t), codes.size()), 0);
      EXPECT_EQ(std::memcmp(params.data(), cache.key_rows().aux(h, t), params.size() * 2), 0);
    }
  }
  // Same bytes as without the rotation: it is not stored.
  EXPECT_EQ(cache.nbytes(),
            UniformKVCache(kv_heads, d, {3, 4, 64}).bytes_per_token_head() * n * kv_heads);
}

}  // namespace
}  // namespace turbokv
