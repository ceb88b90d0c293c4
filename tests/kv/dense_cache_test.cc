// Dense and rotating caches, and the reference attention itself against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "kv/dense_kv_cache.h"
#include "tests/common/random.h"

namespace turbokv {
namespace {

TEST(ReferenceAttention, MatchesHandComputedSoftmax) {
  // q = [1, 0]; keys [1, 0], [0, 1]; values [1, 2], [3, 4]; scale 1 -> scores 1, 0.
  const float k[] = {1, 0, 0, 1};
  const float v[] = {1, 2, 3, 4};
  const float q[] = {1, 0};
  DenseKVView kv{KVDType::kF32, k, v, 1, 2, 2, 2, 0};
  AttentionParams params{1, 1.0f, 0.0f, 0};
  float out[2];
  attention_reference(kv, AttentionQueries{q, 1, 1}, params, out);
  const double p0 = std::exp(1.0) / (std::exp(1.0) + 1.0);  // 0.731059
  EXPECT_NEAR(out[0], p0 * 1 + (1 - p0) * 3, 1e-6);
  EXPECT_NEAR(out[1], p0 * 2 + (1 - p0) * 4, 1e-6);

  params.logit_softcap = 0.5f;  // scores 0.5 tanh(2) = 0.482014, 0
  attention_reference(kv, AttentionQueries{q, 1, 1}, params, out);
  const double c0 = std::exp(0.5 * std::tanh(2.0)) / (std::exp(0.5 * std::tanh(2.0)) + 1.0);
  EXPECT_NEAR(out[0], c0 * 1 + (1 - c0) * 3, 1e-6);

  // Causal: the query at position 0 sees only key 0.
  params.logit_softcap = 0;
  attention_reference(kv, AttentionQueries{q, 1, 0}, params, out);
  EXPECT_FLOAT_EQ(out[0], 1);
  EXPECT_FLOAT_EQ(out[1], 2);
  // Window 1 at position 1: only key 1.
  params.sliding_window = 1;
  attention_reference(kv, AttentionQueries{q, 1, 1}, params, out);
  EXPECT_FLOAT_EQ(out[0], 3);
  EXPECT_FLOAT_EQ(out[1], 4);
}

TEST(RotatingKVCache, ChunkLongerThanWindowSeesEachQueryWindow) {
  const int kv_heads = 2, d = 8, heads = 4, window = 5;
  const AttentionParams params{heads, 0.35f, 0.0f, window};
  DenseKVCache full(kv_heads, d, KVDType::kF32);
  RotatingKVCache rotating(kv_heads, d, window, KVDType::kF32);
  int64_t pos = 0;
  for (int chunk : {3, 12, 1, 1, 7, 300, 2}) {
    const auto k = testing::random_normal(size_t(chunk) * kv_heads * d, 10 + pos);
    const auto v = testing::random_normal(size_t(chunk) * kv_heads * d, 20 + pos);
    const auto q = testing::random_normal(size_t(chunk) * heads * d, 30 + pos);
    full.append(k.data(), v.data(), chunk);
    rotating.append(k.data(), v.data(), chunk);
    pos += chunk;
    std::vector<float> expected(q.size()), got(q.size());
    full.attend(q.data(), chunk, params, expected.data());
    rotating.attend(q.data(), chunk, params, got.data());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expected[i], 1e-5) << pos;
  }
  EXPECT_EQ(rotating.size(), pos);
  EXPECT_LT(rotating.nbytes(), full.nbytes());
}

TEST(RotatingKVCache, TrimWithinHeldPositionsElseUnsupported) {
  const int kv_heads = 1, d = 8, window = 4;
  RotatingKVCache cache(kv_heads, d, window, KVDType::kF32);
  DenseKVCache full(kv_heads, d, KVDType::kF32);
  const auto kv = testing::random_normal(size_t(600) * d, 3);
  cache.append(kv.data(), kv.data(), 300);  // holds all 300 (no eviction needed yet)
  full.append(kv.data(), kv.data(), 300);
  cache.trim(5);
  full.trim(5);
  EXPECT_EQ(cache.size(), 295);
  const auto q = testing::random_normal(size_t(2) * d, 4);
  std::vector<float> a(2 * d), b(2 * d);
  const AttentionParams params{2, 0.3f, 0, window};
  cache.attend(q.data(), 1, params, a.data());
  full.attend(q.data(), 1, params, b.data());
  for (int i = 0; i < 2 * d; ++i) EXPECT_NEAR(a[i], b[i], 1e-6);
  cache.append(kv.data(), kv.data(), 300);  // evicts all but the newest window - 1 before growing
  cache.trim(300);                          // the newest chunk can go: W - 1 older positions remain
  EXPECT_THROW(cache.trim(1), Unsupported);
  EXPECT_THROW(cache.attend(q.data(), 1, AttentionParams{2, 0.3f, 0, 8}, a.data()),
               InvalidArgument);
}

TEST(KVCacheErrors, WrongShapeIsInvalidArgument) {
  DenseKVCache cache(2, 64, KVDType::kF32);
  std::vector<float> kv(3 * 64);
  EXPECT_THROW(cache.append_checked(kv.data(), kv.data(), 1, 3, 64), InvalidArgument);
  EXPECT_THROW(cache.append_checked(kv.data(), kv.data(), 1, 2, 96), InvalidArgument);
  cache.append_checked(kv.data(), kv.data(), 1, 2, 64);
  std::vector<float> out(3 * 64);
  EXPECT_THROW(cache.attend(kv.data(), 1, AttentionParams{3, 1.0f, 0, 0}, out.data()),
               InvalidArgument);
  EXPECT_THROW(cache.attend(kv.data(), 2, AttentionParams{2, 1.0f, 0, 0}, out.data()),
               InvalidArgument);
  EXPECT_THROW(cache.trim(2), InvalidArgument);
  EXPECT_THROW(DenseKVCache(0, 64), InvalidArgument);
}

}  // namespace
}  // namespace turbokv
