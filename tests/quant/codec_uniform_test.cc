// Uniform affine group codec: error bound of half a step per element, exact representation
// of values on the grid, scalar == AVX2 codes, batch == per-vector, score/accumulate.
#include "quant/codec_uniform.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "core/half.h"
#include "test_util.h"

namespace turbokv::quant {
namespace {

TEST(UniformCodec, ErrorIsAtMostHalfAStepPlusFp16Rounding) {
  for (int dim : {32, 80, 128, 130}) {
    for (int group : {32, 64, 128}) {
      for (int bits = 2; bits <= 8; ++bits) {
        const UniformCodec codec({dim, bits, group});
        EXPECT_EQ(codec.groups(), (dim + group - 1) / group);
        const std::vector<float> x = testing::gaussian_matrix(20, dim, dim + bits);
        std::vector<uint8_t> codes(codec.code_bytes());
        std::vector<uint16_t> params(codec.params_per_vector());
        std::vector<float> back(dim);
        for (int t = 0; t < 20; ++t) {
          const float* xt = x.data() + t * dim;
          codec.quantize(xt, codes.data(), params.data());
          codec.dequantize(codes.data(), params.data(), back.data());
          for (int i = 0; i < dim; ++i) {
            const float step = f16_to_f32(params[2 * (i / group)]);
            // half a step, plus the fp16 rounding of min and scale (relative 2^-11 each)
            const float slack = 0.5f * step + 2e-3f * (std::abs(xt[i]) + 1.0f);
            ASSERT_LE(std::abs(back[i] - xt[i]), slack) << dim << "/" << group << "/" << bits;
          }
        }
      }
    }
  }
}

TEST(UniformCodec, ValuesOnTheGridAreExact) {
  // x = 0.5 * q - 2 for q in 0..15: scale 0.5 and min -2 are exact in fp16.
  const UniformCodec codec({32, 4, 32});
  std::vector<float> x(32), back(32);
  for (int i = 0; i < 32; ++i) x[i] = 0.5f * float(i % 16) - 2.0f;
  std::vector<uint8_t> codes(codec.code_bytes());
  std::vector<uint16_t> params(2);
  codec.quantize(x.data(), codes.data(), params.data());
  codec.dequantize(codes.data(), params.data(), back.data());
  EXPECT_EQ(back, x);
}

TEST(UniformCodec, ScalarAndAvx2CodesAreBitIdentical) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (int dim : {3, 64, 80, 96, 128, 130, 256}) {
    for (int group : {32, 64, 128}) {
      for (int bits = 2; bits <= 8; ++bits) {
        const UniformCodec codec({dim, bits, group});
        std::vector<float> x = testing::gaussian_matrix(50, dim, 3 * dim + bits);
        for (int i = 0; i < dim; ++i) x[i] = (i % 2) ? 0.0f : -0.0f;  // signed zeros
        std::vector<uint8_t> c1(50 * codec.code_bytes()), c2(c1.size());
        std::vector<uint16_t> p1(50 * codec.params_per_vector()), p2(p1.size());
        for (int t = 0; t < 50; ++t) {
          codec.quantize(x.data() + t * dim, c1.data() + t * codec.code_bytes(),
                         p1.data() + t * codec.params_per_vector(), Isa::kScalar);
        }
        codec.quantize_batch(x.data(), 50, c2.data(), p2.data(), Isa::kAvx2);
        ASSERT_EQ(c1, c2) << dim << "/" << group << "/" << bits;
        ASSERT_EQ(p1, p2) << dim << "/" << group << "/" << bits;
      }
    }
  }
}

TEST(UniformCodec, ScoreAndAccumulateMatchDequantizedVectors) {
  for (int dim : {64, 100, 128}) {
    for (int bits : {2, 3, 4, 8}) {
      const UniformCodec codec({dim, bits, 32});
      const int n = 29;
      const std::vector<float> x = testing::gaussian_matrix(n, dim, 1);
      const std::vector<float> q = testing::gaussian_matrix(1, dim, 2);
      const std::vector<float> w = testing::gaussian_matrix(1, n, 3);
      std::vector<uint8_t> codes(n * codec.code_bytes());
      std::vector<uint16_t> params(n * codec.params_per_vector());
      std::vector<float> deq(n * dim);
      codec.quantize_batch(x.data(), n, codes.data(), params.data());
      codec.dequantize_batch(codes.data(), params.data(), n, deq.data());
      for (Isa isa : {Isa::kScalar, Isa::kAvx2}) {
        std::vector<float> scores(n), acc(dim, 0.0f);
        codec.score(q.data(), codes.data(), params.data(), n, scores.data(), isa);
        codec.accumulate(w.data(), codes.data(), params.data(), n, acc.data(), isa);
        for (int t = 0; t < n; ++t) {
          double ref = 0, scale = 0;
          for (int i = 0; i < dim; ++i) {
            ref += double(q[i]) * deq[t * dim + i];
            scale += std::abs(double(q[i]) * deq[t * dim + i]);
          }
          EXPECT_NEAR(scores[t], ref, 1e-5 * scale + 1e-5);
        }
        for (int i = 0; i < dim; ++i) {
          double ref = 0, scale = 0;
          for (int t = 0; t < n; ++t) {
            ref += double(w[t]) * deq[t * dim + i];
            scale += std::abs(double(w[t]) * deq[t * dim + i]);
          }
          EXPECT_NEAR(acc[i], ref, 1e-5 * scale + 1e-5);
        }
      }
    }
  }
}

TEST(UniformCodec, InvalidParametersThrowWithMessage) {
  EXPECT_THROW(UniformCodec({128, 1, 64}), InvalidArgument);
  EXPECT_THROW(UniformCodec({128, 9, 64}), InvalidArgument);
  EXPECT_THROW(UniformCodec({0, 4, 64}), InvalidArgument);
  try {
    UniformCodec({128, 4, 48});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("48"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace turbokv::quant
