// Fast CPU kernels (matmul, RMSNorm, RoPE, activations, soft-cap, embedding gather) against
// their scalar references on random inputs, for every weight dtype and shapes that hit the
// SIMD bodies, their tails, the decode path (< 8 rows) and the sgemm path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "tests/common/compare.h"
#include "tests/common/random.h"

namespace turbokv {
namespace {

// Weight storage in a dtype; keeps the bytes alive for the WeightMatrix view.
struct StoredWeight {
  std::vector<uint8_t> bytes;
  WeightMatrix view;
};

StoredWeight store(const std::vector<float>& values, int64_t rows, int64_t cols, DType dtype) {
  StoredWeight s;
  s.bytes.resize(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(s.bytes.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = dtype == DType::F16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
      std::memcpy(s.bytes.data() + 2 * i, &h, 2);
    }
  }
  s.view = WeightMatrix{dtype, s.bytes.data(), rows, cols};
  return s;
}

using testing::relative_error;

struct MatmulCase {
  DType dtype;
  int64_t m, rows, cols;
};

class MatmulTest : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulTest, MatchesReference) {
  const MatmulCase c = GetParam();
  const StoredWeight w =
      store(testing::random_normal(size_t(c.rows * c.cols), 1), c.rows, c.cols, c.dtype);
  const std::vector<float> x = testing::random_normal(size_t(c.m * c.cols), 2);
  const std::vector<float> bias = testing::random_normal(size_t(c.rows), 3);
  // One guard element past the end catches out-of-bounds writes.
  std::vector<float> got(size_t(c.m * c.rows) + 1, 7.0f), want(size_t(c.m * c.rows));
  matmul(x.data(), c.m, w.view, bias.data(), got.data());
  matmul_ref(x.data(), c.m, w.view, bias.data(), want.data());
  EXPECT_EQ(got.back(), 7.0f);
  got.pop_back();
  EXPECT_LT(relative_error(got, want), 2e-6f);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulTest,
    ::testing::Values(MatmulCase{DType::F32, 1, 64, 64}, MatmulCase{DType::BF16, 1, 100, 77},
                      MatmulCase{DType::F16, 3, 33, 130}, MatmulCase{DType::BF16, 5, 257, 512},
                      MatmulCase{DType::F32, 7, 19, 9}, MatmulCase{DType::BF16, 8, 300, 136},
                      MatmulCase{DType::F16, 37, 129, 65}, MatmulCase{DType::F32, 64, 200, 96},
                      MatmulCase{DType::BF16, 300, 260, 128}));

TEST(Matmul, ManyProductsInOneRegionMatchEachReference) {
  const StoredWeight a = store(testing::random_normal(40 * 24, 20), 40, 24, DType::BF16);
  const StoredWeight b = store(testing::random_normal(3 * 24, 21), 3, 24, DType::F32);
  const StoredWeight c = store(testing::random_normal(70 * 24, 22), 70, 24, DType::F16);
  const std::vector<float> bias = testing::random_normal(70, 23);
  for (int64_t m : {1, 5, 20}) {
    const std::vector<float> x = testing::random_normal(size_t(m * 24), 24);
    std::vector<float> ya(size_t(m * 40)), yb(size_t(m * 3)), yc(size_t(m * 70));
    const MatmulJob jobs[] = {{x.data(), a.view, nullptr, ya.data()},
                              {x.data(), b.view, bias.data(), yb.data()},
                              {x.data(), c.view, bias.data(), yc.data()}};
    matmul_many(m, jobs);
    for (const MatmulJob& job : jobs) {
      std::vector<float> got(job.y, job.y + m * job.w.rows), want(got.size());
      matmul_ref(x.data(), m, job.w, job.bias, want.data());
      EXPECT_LT(relative_error(got, want), 2e-6f) << m << " rows " << job.w.rows;
    }
  }
}

TEST(Matmul, RowSliceIsTheSubMatrix) {
  const StoredWeight w = store(testing::random_normal(12 * 8, 4), 12, 8, DType::BF16);
  const std::vector<float> x = testing::random_normal(8, 5);
  std::vector<float> all(12), part(4);
  matmul_ref(x.data(), 1, w.view, nullptr, all.data());
  matmul(x.data(), 1, w.view.row_slice(6, 4), nullptr, part.data());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(part[size_t(i)], all[size_t(6 + i)], 1e-5f);
}

TEST(Matmul, WidenAndGatherMatchReference) {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    const StoredWeight w = store(testing::random_normal(10 * 21, 6), 10, 21, dtype);
    std::vector<float> got(3 * 21), want(3 * 21);
    widen_rows(w.view, 4, 3, got.data());
    widen_rows_ref(w.view, 4, 3, want.data());
    EXPECT_EQ(got, want);
    const int32_t ids[] = {9, 0, 4};
    gather_rows(w.view, ids, 3, 8.0f, got.data());
    gather_rows_ref(w.view, ids, 3, 8.0f, want.data());
    EXPECT_EQ(got, want);
  }
}

TEST(Matmul, GatherRejectsIdsOutsideTheTable) {
  const StoredWeight w = store(testing::random_normal(10 * 4, 7), 10, 4, DType::F32);
  std::vector<float> out(4);
  const int32_t bad[] = {10};
  EXPECT_THROW(gather_rows(w.view, bad, 1, 1.0f, out.data()), InvalidArgument);
}

TEST(Matmul, RejectsIntegerWeights) {
  std::vector<uint8_t> bytes(16);
  const WeightMatrix w{DType::I32, bytes.data(), 2, 2};
  std::vector<float> x(2), y(2);
  EXPECT_THROW(matmul(x.data(), 1, w, nullptr, y.data()), InvalidArgument);
}

TEST(RmsNorm, MatchesReferenceAndDefinition) {
  for (int64_t dim : {16, 64, 77, 512}) {
    const std::vector<float> x = testing::random_normal(size_t(3 * dim), 8, 3.0f);
    const std::vector<float> w = testing::random_normal(size_t(dim), 9);
    std::vector<float> got(x.size()), want(x.size());
    rms_norm(x.data(), 3, dim, w.data(), 1e-6f, got.data());
    rms_norm_ref(x.data(), 3, dim, w.data(), 1e-6f, want.data());
    EXPECT_LT(relative_error(got, want), 1e-6f) << dim;
  }
  // [3, 4] has mean square 12.5: out = x / sqrt(12.5 + eps) * w.
  const float x[] = {3, 4}, w[] = {1, 2};
  float out[2];
  rms_norm_ref(x, 1, 2, w, 0.0f, out);
  EXPECT_NEAR(out[0], 3 / std::sqrt(12.5f), 1e-6f);
  EXPECT_NEAR(out[1], 8 / std::sqrt(12.5f), 1e-6f);
}

TEST(Rope, MatchesReferenceAndRotatesPairs) {
  RopeTable rope;
  for (int i = 0; i < 8; ++i) rope.inv_freq.push_back(std::pow(10000.0f, -float(2 * i) / 16));
  rope.attention_scaling = 1.25f;
  const int64_t positions[] = {0, 1, 7, 1000, 4095};
  std::vector<float> got = testing::random_normal(5 * 3 * 20, 10),
                     want = got;  // [5, 3, 20], rotary 16
  const std::vector<float> before = got;
  apply_rope(got.data(), 5, 3, 20, positions, rope);
  apply_rope_ref(want.data(), 5, 3, 20, positions, rope);
  EXPECT_LT(relative_error(got, want), 1e-6f);
  // Position 0: only the attention scaling applies; dims past rotary_dim pass through.
  for (int j = 0; j < 16; ++j) EXPECT_NEAR(got[size_t(j)], 1.25f * before[size_t(j)], 1e-6f);
  for (int j = 16; j < 20; ++j) EXPECT_EQ(got[size_t(j)], before[size_t(j)]);
  // Position 1, pair 0 (dims 0 and 8) turns by exactly 1 radian.
  const float* b = before.data() + 60;
  EXPECT_NEAR(got[60], 1.25f * (b[0] * std::cos(1.0f) - b[8] * std::sin(1.0f)), 1e-5f);
  EXPECT_NEAR(got[68], 1.25f * (b[8] * std::cos(1.0f) + b[0] * std::sin(1.0f)), 1e-5f);
}

TEST(Activation, MatchesReferenceAndKnownValues) {
  const std::vector<float> gate = testing::random_normal(1003, 11, 4.0f),
                           up = testing::random_normal(1003, 12);
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    std::vector<float> got(gate.size()), want(gate.size());
    gated_activation(gate.data(), up.data(), int64_t(gate.size()), act, got.data());
    gated_activation_ref(gate.data(), up.data(), int64_t(gate.size()), act, want.data());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-6f * (1 + std::abs(want[i])));
  }
  // silu(1) = 1 / (1 + e^-1); gelu_tanh(1) = 0.8411919906 (torch gelu approximate="tanh").
  const float one = 1.0f;
  float out;
  gated_activation_ref(&one, &one, 1, Activation::kSilu, &out);
  EXPECT_NEAR(out, 0.7310585786f, 1e-7f);
  gated_activation_ref(&one, &one, 1, Activation::kGeluTanh, &out);
  EXPECT_NEAR(out, 0.8411919906f, 1e-6f);
  // Extremes stay finite.
  const float big[] = {-200, 200, -90, 90, 0, 0, 0, 0, 0};
  const float ones[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  float res[9];
  gated_activation(big, ones, 9, Activation::kSilu, res);
  EXPECT_NEAR(res[0], 0.0f, 1e-6f);
  EXPECT_NEAR(res[1], 200.0f, 1e-4f);
}

TEST(Softcap, MatchesReference) {
  std::vector<float> got = testing::random_normal(517, 13, 60.0f), want = got;
  softcap(got.data(), int64_t(got.size()), 30.0f);
  softcap_ref(want.data(), int64_t(want.size()), 30.0f);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 3e-5f);
  for (float v : got) ASSERT_LE(std::abs(v), 30.0f);
}

}  // namespace
}  // namespace turbokv
