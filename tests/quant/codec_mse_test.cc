// MSE codec: distortion against the paper's numbers by Monte Carlo, round trips, norm correction,
// scalar vs AVX2 bit-identity, batch vs per-vector identity, attention primitives.
#include "quant/codec_mse.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "test_util.h"

namespace turbokv::quant {
namespace {

struct Coded {
  std::vector<uint8_t> codes;   // [n, code_bytes]
  std::vector<uint16_t> norms;  // [n]
};

Coded quantize_each(const MseCodec& codec, const std::vector<float>& x, int64_t n, Isa isa) {
  Coded out{std::vector<uint8_t>(n * codec.code_bytes()), std::vector<uint16_t>(n)};
  for (int64_t t = 0; t < n; ++t) {
    codec.quantize(x.data() + t * codec.dim(), out.codes.data() + t * codec.code_bytes(),
                   out.norms.data() + t, isa);
  }
  return out;
}

double mean_unit_mse(const MseCodec& codec, int64_t n, uint64_t seed) {
  const int d = codec.dim();
  const std::vector<float> x = testing::unit_vectors(n, d, seed);
  std::vector<uint8_t> codes(codec.code_bytes());
  std::vector<float> back(d);
  double total = 0;
  for (int64_t t = 0; t < n; ++t) {
    uint16_t norm;
    codec.quantize(x.data() + t * d, codes.data(), &norm);
    codec.dequantize(codes.data(), &norm, back.data());
    for (int i = 0; i < d; ++i) total += std::pow(double(back[i]) - x[t * d + i], 2);
  }
  return total / double(n);
}

TEST(MseCodec, DistortionMatchesDesignAtDim128) {
  const double expected[] = {0.3609, 0.1160, 0.0340, 0.0093};
  for (int bits = 1; bits <= 4; ++bits) {
    const MseCodec codec({128, bits, 0, RotationRole::kKey, false});
    EXPECT_NEAR(mean_unit_mse(codec, 4000, 11), expected[bits - 1], 0.03 * expected[bits - 1])
        << "bits " << bits;
  }
}

TEST(MseCodec, NormCorrectionRestoresTheNormAndDoesNotHurtAtLowBits) {
  for (int bits = 1; bits <= 4; ++bits) {
    const MseCodec plain({128, bits, 0, RotationRole::kKey, false});
    const MseCodec corrected({128, bits, 0, RotationRole::kKey, true});
    const double plain_mse = mean_unit_mse(plain, 2000, 5);
    const double corrected_mse = mean_unit_mse(corrected, 2000, 5);
    EXPECT_LT(corrected_mse, plain_mse * 1.5) << "bits " << bits;
  }
  const MseCodec codec({96, 2, 0, RotationRole::kValue, true});
  const std::vector<float> x = testing::gaussian_matrix(50, 96, 3);
  std::vector<uint8_t> codes(codec.code_bytes());
  std::vector<float> back(96);
  for (int t = 0; t < 50; ++t) {
    uint16_t norm;
    codec.quantize(x.data() + t * 96, codes.data(), &norm);
    codec.dequantize(codes.data(), &norm, back.data());
    double n_in = 0, n_out = 0;
    for (int i = 0; i < 96; ++i) {
      n_in += double(x[t * 96 + i]) * x[t * 96 + i];
      n_out += double(back[i]) * back[i];
    }
    EXPECT_NEAR(std::sqrt(n_out), std::sqrt(n_in), 2e-3 * std::sqrt(n_in));  // fp16 norm
  }
}

// The unbiased norm s = n / <y, c> makes the decoded vector's projection on x exact:
// <x, R^T (s c)> = s <R x, c> = s n <y, c> = n^2 (up to the fp16 norm), at every bit width;
// the norm correction's n / ||c|| falls short by the factor <y, c> / ||c|| < 1 (the codes'
// error), the plain norm by <y, c>.
TEST(MseCodec, UnbiasedNormKeepsTheInnerProductWithTheVector) {
  for (int bits : {1, 2, 3, 4}) {
    const MseCodec unbiased({128, bits, 0, RotationRole::kKey, true, true});
    const MseCodec corrected({128, bits, 0, RotationRole::kKey, true, false});
    const std::vector<float> x = testing::gaussian_matrix(50, 128, 11 + bits);
    std::vector<uint8_t> codes(unbiased.code_bytes());
    std::vector<float> back(128);
    double corrected_ratio = 0;
    for (int t = 0; t < 50; ++t) {
      const float* v = x.data() + t * 128;
      double energy = 0;
      for (int i = 0; i < 128; ++i) energy += double(v[i]) * v[i];
      for (const MseCodec* codec : {&unbiased, &corrected}) {
        uint16_t norm;
        codec->quantize(v, codes.data(), &norm);
        codec->dequantize(codes.data(), &norm, back.data());
        double projection = 0;
        for (int i = 0; i < 128; ++i) projection += double(back[i]) * v[i];
        if (codec == &unbiased) {
          EXPECT_NEAR(projection / energy, 1.0, 1e-3) << "bits " << bits;  // fp16 norm
        } else {
          corrected_ratio += projection / energy / 50;
        }
      }
    }
    // 1 - ratio ~ D/2 (D: the codebook's unit MSE), far above the fp16 tolerance.
    EXPECT_LT(corrected_ratio, 1.0 - 0.2 * lloyd_max_codebook(128, bits).unit_mse)
        << "bits " << bits;
  }
}

TEST(MseCodec, RoundTripOfEveryDimAndBitWidth) {
  for (int dim : {2, 3, 64, 80, 96, 128, 256}) {
    for (int bits = 1; bits <= 8; ++bits) {
      const MseCodec codec({dim, bits, 7, RotationRole::kKey, true});
      const std::vector<float> x = testing::gaussian_matrix(64, dim, 100 + dim);
      std::vector<uint8_t> codes(codec.code_bytes());
      std::vector<float> back(dim);
      double err = 0, energy = 0;
      for (int t = 0; t < 64; ++t) {
        uint16_t norm;
        codec.quantize(x.data() + t * dim, codes.data(), &norm);
        codec.dequantize(codes.data(), &norm, back.data());
        for (int i = 0; i < dim; ++i) {
          err += std::pow(double(back[i]) - x[t * dim + i], 2);
          energy += double(x[t * dim + i]) * x[t * dim + i];
        }
      }
      // relative error bounded by ~2x the unit-vector MSE of the codebook (+ fp16 norm)
      const double bound = 2.5 * lloyd_max_codebook(dim, bits).unit_mse + 1e-5;
      EXPECT_LT(err / energy, bound) << "dim " << dim << " bits " << bits;
    }
  }
}

TEST(MseCodec, ZeroVectorRoundTripsToZero) {
  const MseCodec codec({128, 3, 0, RotationRole::kKey, true});
  std::vector<float> x(128, 0.0f), back(128, 1.0f);
  std::vector<uint8_t> codes(codec.code_bytes());
  uint16_t norm;
  codec.quantize(x.data(), codes.data(), &norm);
  codec.dequantize(codes.data(), &norm, back.data());
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

TEST(MseCodec, ScalarAndAvx2CodesAreBitIdentical) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (int dim : {2, 3, 5, 12, 64, 80, 96, 128, 256}) {
    for (int bits = 1; bits <= 8; ++bits) {
      for (int mode = 0; mode < 3; ++mode) {  // plain, norm correction, unbiased norm
        const MseCodec codec({dim, bits, 3, RotationRole::kValue, mode >= 1, mode == 2});
        std::vector<float> x = testing::gaussian_matrix(200, dim, 1000 + dim * 8 + bits);
        for (int i = 0; i < dim; ++i) x[i] = 0.0f;  // an all-zero vector too
        const Coded scalar = quantize_each(codec, x, 200, Isa::kScalar);
        const Coded simd = quantize_each(codec, x, 200, Isa::kAvx2);
        ASSERT_EQ(scalar.codes, simd.codes) << "dim " << dim << " bits " << bits;
        ASSERT_EQ(scalar.norms, simd.norms) << "dim " << dim << " bits " << bits;
      }
    }
  }
}

TEST(MseCodec, BatchEqualsPerVector) {
  set_num_threads(2);
  for (int dim : {2, 3, 64, 80, 96, 128, 256}) {
    for (int bits : {1, 2, 3, 4, 8}) {
      const MseCodec codec({dim, bits, 0, RotationRole::kKey, true});
      const int64_t n = 777;
      const std::vector<float> x = testing::gaussian_matrix(n, dim, 55);
      for (Isa isa : {Isa::kScalar, best_isa()}) {
        const Coded single = quantize_each(codec, x, n, isa);
        Coded batch{std::vector<uint8_t>(n * codec.code_bytes()), std::vector<uint16_t>(n)};
        codec.quantize_batch(x.data(), n, batch.codes.data(), batch.norms.data(), isa);
        ASSERT_EQ(single.codes, batch.codes) << "dim " << dim << " bits " << bits;
        ASSERT_EQ(single.norms, batch.norms) << "dim " << dim << " bits " << bits;
        std::vector<float> back_batch(n * dim), back_single(dim);
        codec.dequantize_batch(batch.codes.data(), batch.norms.data(), n, back_batch.data());
        for (int64_t t = 0; t < n; t += 97) {
          codec.dequantize(batch.codes.data() + t * codec.code_bytes(), &batch.norms[t],
                           back_single.data());
          ASSERT_EQ(0, std::memcmp(back_single.data(), back_batch.data() + t * dim, 4 * dim));
        }
      }
    }
  }
}

// score / accumulate on codes equal the same computations on dequantized vectors.
TEST(MseCodec, ScoreAndAccumulateMatchDequantizedVectors) {
  for (int dim : {3, 8, 12, 64, 80, 128}) {
    for (int bits : {1, 2, 3, 4, 5, 6, 7, 8}) {
      const MseCodec codec({dim, bits, 1, RotationRole::kKey, true});
      const int64_t n = 37;
      const std::vector<float> x = testing::gaussian_matrix(n, dim, 9);
      const std::vector<float> q = testing::gaussian_matrix(1, dim, 10);
      const std::vector<float> w = testing::gaussian_matrix(1, int(n), 12);
      Coded coded = quantize_each(codec, x, n, Isa::kScalar);
      std::vector<float> deq(n * dim);
      codec.dequantize_batch(coded.codes.data(), coded.norms.data(), n, deq.data());
      for (Isa isa : {Isa::kScalar, Isa::kAvx2}) {
        std::vector<float> rq(dim), scores(n), acc(dim, 0.0f), out(dim);
        codec.rotate_query(q.data(), rq.data(), isa);
        codec.score(rq.data(), coded.codes.data(), coded.norms.data(), n, scores.data(), isa);
        codec.accumulate(w.data(), coded.codes.data(), coded.norms.data(), n, acc.data(), isa);
        codec.unrotate(acc.data(), out.data(), isa);
        for (int64_t t = 0; t < n; ++t) {
          double ref = 0, scale = 0;
          for (int i = 0; i < dim; ++i) {
            ref += double(q[i]) * deq[t * dim + i];
            scale += std::abs(double(q[i]) * deq[t * dim + i]);
          }
          EXPECT_NEAR(scores[t], ref, 1e-5 * scale + 1e-6) << dim << "/" << bits;
        }
        for (int i = 0; i < dim; ++i) {
          double ref = 0, scale = 0;
          for (int64_t t = 0; t < n; ++t) {
            ref += double(w[t]) * deq[t * dim + i];
            scale += std::abs(double(w[t]) * deq[t * dim + i]);
          }
          EXPECT_NEAR(out[i], ref, 1e-5 * scale + 1e-6) << dim << "/" << bits;
        }
      }
    }
  }
}

TEST(MseCodec, InvalidParametersThrowWithMessage) {
  EXPECT_THROW(MseCodec({128, 0}), InvalidArgument);
  EXPECT_THROW(MseCodec({128, 9}), InvalidArgument);
  EXPECT_THROW(MseCodec({0, 3}), InvalidArgument);
  EXPECT_THROW(MseCodec({1, 3}), InvalidArgument);
  try {
    MseCodec({128, 9});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("9"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace turbokv::quant
