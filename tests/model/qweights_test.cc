// Quantized weight formats: one hand-built block per format dequantizes to the values worked
// out by hand from the layout; on random blocks the fast matmul (int8 activations for few
// rows, dequantized sgemm panels for many) stays within the int8 rounding of the f32
// reference, and the AVX2 integer kernel equals its scalar reference up to f32 rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "core/half.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/qmatmul_avx2.h"
#include "kernels/cpu/qmatmul_avx512.h"
#include "tests/common/compare.h"
#include "tests/common/random.h"
#include "tests/common/random_weights.h"

namespace turbokv {
namespace {

using testing::put_u16;

std::vector<float> dequant(const WeightMatrix& w) {
  std::vector<float> out(size_t(w.rows * w.cols));
  dequantize_rows_ref(w, 0, w.rows, out.data());
  return out;
}

WeightMatrix quantized(WeightFormat format, const std::vector<uint8_t>& bytes, int64_t rows,
                       int64_t cols) {
  WeightMatrix w{DType::F32, bytes.data(), rows, cols};
  w.format = format;
  return w;
}

TEST(QuantBlocks, Q8_0) {
  std::vector<uint8_t> b(34, 0);
  put_u16(b, 0, 0x3800);  // d = 0.5
  b[2] = 2;
  b[3] = uint8_t(-3);
  b[4] = 127;
  b[5] = 0x80;  // -128
  const std::vector<float> y = dequant(quantized(WeightFormat::kQ8_0, b, 1, 32));
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -1.5f);
  EXPECT_EQ(y[2], 63.5f);
  EXPECT_EQ(y[3], -64.0f);
  EXPECT_EQ(y[31], 0.0f);
}

TEST(QuantBlocks, Q4_0) {
  std::vector<uint8_t> b(18, 0x88);  // every value 0 ...
  put_u16(b, 0, 0x3800);             // d = 0.5
  b[2] = 0x3A;                       // value 0 = 10 - 8, value 16 = 3 - 8
  b[17] = 0xF0;                      // value 15 = 0 - 8, value 31 = 15 - 8
  const std::vector<float> y = dequant(quantized(WeightFormat::kQ4_0, b, 1, 32));
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[16], -2.5f);
  EXPECT_EQ(y[15], -4.0f);
  EXPECT_EQ(y[31], 3.5f);
  EXPECT_EQ(y[5], 0.0f);
}

TEST(QuantBlocks, Q5_0) {
  std::vector<uint8_t> b(22, 0);
  put_u16(b, 0, 0x3800);            // d = 0.5
  const uint32_t qh = 0x80010001u;  // bit 4 set for values 0, 16 and 31
  std::memcpy(b.data() + 2, &qh, 4);
  b[6] = 0x3A;
  b[21] = 0xF0;
  const std::vector<float> y = dequant(quantized(WeightFormat::kQ5_0, b, 1, 32));
  EXPECT_EQ(y[0], 5.0f);    // (10 + 16 - 16) / 2
  EXPECT_EQ(y[16], 1.5f);   // (3 + 16 - 16) / 2
  EXPECT_EQ(y[15], -8.0f);  // (0 - 16) / 2
  EXPECT_EQ(y[31], 7.5f);   // (15 + 16 - 16) / 2
  EXPECT_EQ(y[1], -8.0f);
}

TEST(QuantBlocks, Q4_K) {
  std::vector<uint8_t> b(144, 0);
  put_u16(b, 0, 0x3C00);  // d = 1
  put_u16(b, 2, 0x3800);  // dmin = 0.5
  uint8_t* s = b.data() + 4;
  s[0] = 3;     // sub-block 0: scale 3
  s[4] = 2;     //              min 2
  s[9] = 0x21;  // sub-block 5: scale low bits 1, min low bits 2
  s[1] = 0x40;  //              scale bits 4-5 = 1 -> 17
  s[5] = 0x80;  //              min bits 4-5 = 2 -> 34
  uint8_t* qs = b.data() + 16;
  qs[0] = 0x07;   // value 0 (low nibble): 7; value 32 (high nibble): 0
  qs[64] = 0x90;  // value 160 (high nibble of the third 32 bytes): 9
  const std::vector<float> y = dequant(quantized(WeightFormat::kQ4_K, b, 1, 256));
  EXPECT_EQ(y[0], 20.0f);     // 1 * 3 * 7 - 0.5 * 2
  EXPECT_EQ(y[1], -1.0f);     // 0 - 0.5 * 2
  EXPECT_EQ(y[32], 0.0f);     // sub-block 1: scale 0, min 0
  EXPECT_EQ(y[160], 136.0f);  // 1 * 17 * 9 - 0.5 * 34
  EXPECT_EQ(y[161], -17.0f);
}

TEST(QuantBlocks, Q6_K) {
  std::vector<uint8_t> b(210, 0);
  put_u16(b, 208, 0x3800);   // d = 0.5
  b[192 + 0] = 2;            // scale of values 0..15
  b[192 + 5] = uint8_t(-3);  // scale of values 80..95
  b[0] = 0x05;               // value 0: low 4 bits 5
  b[128 + 0] = 0x02;         //          high 2 bits 2 -> q = 37
  b[16] = 0xC0;              // value 80 (quarter 2, lane 16): high nibble of ql[16] = 12
  b[128 + 16] = 0x10;        //          bits 4-5 of qh[16] = 1 -> q = 28
  const std::vector<float> y = dequant(quantized(WeightFormat::kQ6_K, b, 1, 256));
  EXPECT_EQ(y[0], 5.0f);    // 0.5 * 2 * (37 - 32)
  EXPECT_EQ(y[1], -32.0f);  // 0.5 * 2 * (0 - 32)
  EXPECT_EQ(y[80], 6.0f);   // 0.5 * -3 * (28 - 32)
  EXPECT_EQ(y[81], 48.0f);  // 0.5 * -3 * (0 - 32)
}

TEST(QuantBlocks, MlxAffine4And8Bits) {
  const std::vector<uint8_t> scales = {0x00, 0x3F}, biases = {0x80, 0xBF};  // bf16 0.5, -1
  for (int bits : {4, 8}) {
    std::vector<uint8_t> codes(size_t(32 * bits / 8), 0);
    const uint32_t word = bits == 4 ? 0x76543210u : 0x04030201u;
    std::memcpy(codes.data(), &word, 4);
    WeightMatrix w{DType::BF16, codes.data(), 1, 32};
    w.format = WeightFormat::kAffine;
    w.affine = AffineParams{scales.data(), biases.data(), DType::BF16, bits, 32};
    const std::vector<float> y = dequant(w);
    for (int j = 0; j < 4; ++j) {
      const float q = bits == 4 ? float(j) : float(j + 1);
      EXPECT_EQ(y[size_t(j)], 0.5f * q - 1.0f) << bits << " bits, value " << j;
    }
    EXPECT_EQ(y[31], -1.0f);
  }
}

using testing::random_weight;
using testing::RandomWeight;
using testing::relative_error;

struct FormatCase {
  WeightFormat format;
  int bits;
};

class QuantMatmul : public ::testing::TestWithParam<FormatCase> {};

TEST_P(QuantMatmul, FastPathWithinInt8RoundingOfReference) {
  const int64_t rows = 37, cols = 512;
  const RandomWeight r = random_weight(GetParam().format, GetParam().bits, rows, cols, 7);
  for (int64_t m : {1, 3, 5, 9}) {
    const std::vector<float> x = testing::random_normal(size_t(m * cols), uint32_t(m));
    std::vector<float> y(size_t(m * rows)), want(y.size());
    matmul(x.data(), m, r.w, nullptr, y.data());
    matmul_ref(x.data(), m, r.w, nullptr, want.data());
    // int8 activations round each value by up to half a step of max|x|/127 per 32.
    const float tolerance = m < 8 && int8_activations_enabled() ? 3e-2f : 1e-4f;
    EXPECT_LE(relative_error(y, want), tolerance)
        << weight_format_name(GetParam().format) << " m=" << m;
  }
}

TEST_P(QuantMatmul, Avx2IntegerKernelEqualsScalarReference) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 (or TURBOKV_FORCE_SCALAR)";
  const int64_t rows = 21, cols = 512;
  const RandomWeight r = random_weight(GetParam().format, GetParam().bits, rows, cols, 11);
  ASSERT_TRUE(avx2::qmatmul_supported(r.w));
  for (int64_t m : {1, 2, 3, 4, 6}) {
    const std::vector<float> x = testing::random_normal(size_t(m * cols), uint32_t(100 + m));
    const ActivationBlocks xq = quantize_activations(x.data(), m, cols, uses_nibble_order(r.w));
    std::vector<float> y(size_t(m * rows)), want(y.size());
    avx2::qmatmul_rows(xq, r.w, 0, rows, y.data());
    qmatmul_rows_ref(xq, r.w, 0, rows, want.data());
    EXPECT_LE(relative_error(y, want), 1e-5f)
        << weight_format_name(GetParam().format) << " m=" << m;
  }
}

// The AVX-512 VNNI kernels (two or four weight rows per pass and a one-row tail; up to 4
// activation rows per pass, so 6 takes two passes) against the same reference.
TEST_P(QuantMatmul, Avx512VnniIntegerKernelEqualsScalarReference) {
  if (!avx512::qmatmul_vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI (or forced off)";
  const int64_t rows = 21, cols = 512;
  for (int group : {32, 64, 128}) {
    if (GetParam().format != WeightFormat::kAffine && group != 64) continue;
    for (DType scale_dtype : {DType::BF16, DType::F16}) {
      if (GetParam().format != WeightFormat::kAffine && scale_dtype != DType::BF16) continue;
      const RandomWeight r =
          random_weight(GetParam().format, GetParam().bits, rows, cols, 13, group, scale_dtype);
      ASSERT_TRUE(avx512::qmatmul_supported(r.w));
      for (int64_t m : {1, 2, 3, 4, 6}) {
        const std::vector<float> x = testing::random_normal(size_t(m * cols), uint32_t(200 + m));
        const ActivationBlocks xq =
            quantize_activations(x.data(), m, cols, uses_nibble_order(r.w));
        std::vector<float> y(size_t(m * rows)), want(y.size());
        qmatmul_rows_ref(xq, r.w, 0, rows, want.data());
        // All 21 rows (4-row passes and a one-row tail), and rows [2, 20) inside the matrix
        // (4-row passes and a two-row one) with the rows outside left untouched.
        avx512::qmatmul_rows(xq, r.w, 0, rows, y.data());
        EXPECT_LE(relative_error(y, want), 1e-5f)
            << weight_format_name(GetParam().format) << " group " << group << " "
            << dtype_name(scale_dtype) << " m=" << m << ", all rows";
        std::fill(y.begin(), y.end(), -7.0f);
        avx512::qmatmul_rows(xq, r.w, 2, rows - 1, y.data());
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t n : {int64_t(0), int64_t(1), rows - 1}) {
            EXPECT_EQ(y[size_t(i * rows + n)], -7.0f);
            y[size_t(i * rows + n)] = want[size_t(i * rows + n)];
          }
        }
        EXPECT_LE(relative_error(y, want), 1e-5f)
            << weight_format_name(GetParam().format) << " group " << group << " "
            << dtype_name(scale_dtype) << " m=" << m << ", rows [2, 20)";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QuantMatmul,
    ::testing::Values(FormatCase{WeightFormat::kQ8_0, 0}, FormatCase{WeightFormat::kQ4_0, 0},
                      FormatCase{WeightFormat::kQ5_0, 0}, FormatCase{WeightFormat::kQ4_K, 0},
                      FormatCase{WeightFormat::kQ6_K, 0}, FormatCase{WeightFormat::kAffine, 4},
                      FormatCase{WeightFormat::kAffine, 8}));

// The int8 activation blocks: q within one step of x / d, d = max|x| / 127, and the nibble
// order of MLX 4-bit weights is a permutation of each 32-window (evens, then odds).
TEST(QuantActivations, BlocksAndNibbleOrder) {
  const std::vector<float> x = testing::random_normal(64, 3);
  const ActivationBlocks plain = quantize_activations(x.data(), 1, 64, false);
  const ActivationBlocks nib = quantize_activations(x.data(), 1, 64, true);
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[size_t(32 * b + j)]));
    EXPECT_FLOAT_EQ(plain.d[size_t(b)], amax / 127);
    for (int j = 0; j < 32; ++j) {
      EXPECT_NEAR(plain.q[size_t(32 * b + j)] * plain.d[size_t(b)], x[size_t(32 * b + j)],
                  plain.d[size_t(b)] * 0.5001f);
      const int natural = j < 16 ? 2 * j : 2 * (j - 16) + 1;
      EXPECT_EQ(nib.q[size_t(32 * b + j)], plain.q[size_t(32 * b + natural)]);
    }
  }
}

}  // namespace
}  // namespace turbokv
