// The bits -> codec factory (including invalid bits), the split codec for k + 0.5 bits and the
// Prod (QJL) codec's score.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "quant/codec_prod.h"
#include "quant/codec_split.h"
#include "test_util.h"

namespace turbokv::quant {
namespace {

TurboQuantConfig plain(int dim, double bits) {
  TurboQuantConfig config;
  config.dim = dim;
  config.bits = bits;
  return config;
}

void expect_invalid(const TurboQuantConfig& config, const std::string& needle) {
  try {
    make_turboquant_codec(config);
    FAIL() << "accepted " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CodecFactory, InvalidBitsAndDimsGiveInvalidArgumentWithMessage) {
  expect_invalid(plain(128, 0), "bits=0 ");
  expect_invalid(plain(128, 9), "bits=9 ");
  expect_invalid(plain(128, 2.25), "bits=2.25 ");
  expect_invalid(plain(128, 0.5), "bits=0.5 ");
  expect_invalid(plain(0, 3), "dimension 0");
  expect_invalid(plain(0, 3.5), "dimension 0");
  expect_invalid({8, 3.5, 0, TensorRole::kKey, true, {0, 1, 2}}, "3 entries");
  expect_invalid({4, 3.5, 0, TensorRole::kKey, true, {0, 1, 1, 3}}, "repeated channel 1");
}

TEST(CodecFactory, IntegerBitsGiveMseAndHalfBitsGiveSplit) {
  const auto mse = make_turboquant_codec(plain(128, 3));
  EXPECT_NE(dynamic_cast<const MseCodec*>(mse.get()), nullptr);
  EXPECT_EQ(mse->bytes_per_vector(), 48u + 2u);
  const auto split = make_turboquant_codec(plain(128, 3.5));
  ASSERT_NE(dynamic_cast<const SplitCodec*>(split.get()), nullptr);
  EXPECT_EQ(split->bits(), 3.5);
  EXPECT_EQ(split->code_bytes(), 64u * 4 / 8 + 64u * 3 / 8);
  EXPECT_EQ(split->norms_per_vector(), 2);
}

TEST(SplitCodec, ChannelChooserRanksByMeanAbsoluteValue) {
  std::vector<float> x(3 * 4);  // [3, 4]: channel magnitudes 1, 4, 2, 3
  const float magnitude[4] = {1, 4, 2, 3};
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < 4; ++i) x[t * 4 + i] = (t % 2 ? -1.0f : 1.0f) * magnitude[i];
  }
  EXPECT_EQ(choose_split_channels(x.data(), 3, 4), (std::vector<int>{1, 3, 2, 0}));
  EXPECT_THROW(choose_split_channels(x.data(), 0, 4), InvalidArgument);
}

TEST(SplitCodec, ErrorLiesBetweenItsTwoBitWidths) {
  const int d = 128, n = 500;
  const std::vector<float> x = testing::gaussian_matrix(n, d, 21);
  auto relative_error = [&](const TurboQuantCodec& codec) {
    std::vector<uint8_t> codes(n * codec.code_bytes());
    std::vector<uint16_t> norms(n * codec.norms_per_vector());
    std::vector<float> back(n * d);
    codec.quantize_batch(x.data(), n, codes.data(), norms.data());
    codec.dequantize_batch(codes.data(), norms.data(), n, back.data());
    double err = 0, energy = 0;
    for (int i = 0; i < n * d; ++i) {
      err += std::pow(double(back[i]) - x[i], 2);
      energy += double(x[i]) * x[i];
    }
    return err / energy;
  };
  const double e3 = relative_error(*make_turboquant_codec(plain(d, 3)));
  const double e35 = relative_error(*make_turboquant_codec(plain(d, 3.5)));
  const double e4 = relative_error(*make_turboquant_codec(plain(d, 4)));
  EXPECT_LT(e4, e35);
  EXPECT_LT(e35, e3);
}

TEST(SplitCodec, CodesBitIdenticalAcrossPathsAndPrimitivesMatchDequantize) {
  for (int d : {4, 7, 64, 80, 96, 128}) {
    for (double bits : {1.5, 2.5, 3.5, 7.5}) {
      const std::vector<float> x = testing::gaussian_matrix(40, d, d * 10 + int(bits * 2));
      TurboQuantConfig config{
          d, bits, 2, TensorRole::kValue, true, choose_split_channels(x.data(), 16, d)};
      const auto codec = make_turboquant_codec(config);
      const size_t cb = codec->code_bytes();
      std::vector<uint8_t> c1(40 * cb), c2(40 * cb);
      std::vector<uint16_t> n1(80), n2(80);
      for (int t = 0; t < 40; ++t) {
        codec->quantize(x.data() + t * d, c1.data() + t * cb, n1.data() + 2 * t, Isa::kScalar);
      }
      codec->quantize_batch(x.data(), 40, c2.data(), n2.data(), best_isa());
      ASSERT_EQ(c1, c2) << d << "/" << bits;
      ASSERT_EQ(n1, n2) << d << "/" << bits;
      std::vector<float> deq(40 * d), q = testing::gaussian_matrix(1, d, 5);
      std::vector<float> w = testing::gaussian_matrix(1, 40, 6);
      codec->dequantize_batch(c1.data(), n1.data(), 40, deq.data());
      std::vector<float> rq(d), scores(40), acc(d, 0.0f), out(d);
      codec->rotate_query(q.data(), rq.data());
      codec->score(rq.data(), c1.data(), n1.data(), 40, scores.data());
      codec->accumulate(w.data(), c1.data(), n1.data(), 40, acc.data());
      codec->unrotate(acc.data(), out.data());
      for (int t = 0; t < 40; ++t) {
        double ref = 0;
        for (int i = 0; i < d; ++i) ref += double(q[i]) * deq[t * d + i];
        EXPECT_NEAR(scores[t], ref, 1e-4 * (1 + std::abs(ref))) << d << "/" << bits;
      }
      for (int i = 0; i < d; ++i) {
        double ref = 0;
        for (int t = 0; t < 40; ++t) ref += double(w[t]) * deq[t * d + i];
        EXPECT_NEAR(out[i], ref, 1e-4 * (1 + std::abs(ref))) << d << "/" << bits;
      }
    }
  }
}

// score_multi / accumulate_multi (GQA: several query heads per pass) equal one call per query.
TEST(CodecMulti, MultiQueryFormsEqualSingleQueryCalls) {
  for (double bits : {2.0, 3.0, 3.5, 4.0, 5.0}) {
    for (int d : {12, 80, 128}) {
      const auto codec = make_turboquant_codec(plain(d, bits));
      const int n = 133;  // three row tiles of the AVX2 accumulate, the last one odd
      const std::vector<float> x = testing::gaussian_matrix(n, d, 4);
      std::vector<uint8_t> codes(n * codec->code_bytes());
      std::vector<uint16_t> norms(n * codec->norms_per_vector());
      codec->quantize_batch(x.data(), n, codes.data(), norms.data());
      for (int m : {1, 2, 3, 4, 6}) {
        const std::vector<float> rq = testing::gaussian_matrix(m, d, 7);  // [m, d]
        const std::vector<float> w = testing::gaussian_matrix(m, n, 8);   // [m, n]
        for (Isa isa : {Isa::kScalar, Isa::kAvx2}) {
          std::vector<float> scores(m * n), acc(m * d, 0.5f);
          codec->score_multi(rq.data(), m, codes.data(), norms.data(), n, scores.data(), isa);
          codec->accumulate_multi(w.data(), m, codes.data(), norms.data(), n, acc.data(), isa);
          for (int j = 0; j < m; ++j) {
            std::vector<float> one(n), one_acc(d, 0.5f);
            codec->score(rq.data() + j * d, codes.data(), norms.data(), n, one.data(),
                         Isa::kScalar);
            codec->accumulate(w.data() + j * n, codes.data(), norms.data(), n, one_acc.data(),
                              Isa::kScalar);
            for (int t = 0; t < n; ++t) {
              EXPECT_NEAR(scores[j * n + t], one[t], 1e-4 * (1 + std::abs(one[t])))
                  << bits << "/" << d << "/" << m;
            }
            for (int i = 0; i < d; ++i) {
              EXPECT_NEAR(acc[j * d + i], one_acc[i], 1e-4 * (1 + std::abs(one_acc[i])))
                  << bits << "/" << d << "/" << m;
            }
          }
        }
      }
    }
  }
}

TEST(ProdCodec, ScoreEqualsInnerProductWithReconstruction) {
  const int d = 80;
  const ProdCodec codec({d, 3, 4});
  const std::vector<float> x = testing::gaussian_matrix(10, d, 1);
  const std::vector<float> q = testing::gaussian_matrix(1, d, 2);
  std::vector<uint8_t> codes(10 * codec.code_bytes());
  std::vector<uint16_t> norms(20);
  codec.quantize_batch(x.data(), 10, codes.data(), norms.data());
  std::vector<float> prepared(2 * d), scores(10), back(d);
  codec.prepare_query(q.data(), prepared.data());
  codec.score(prepared.data(), codes.data(), norms.data(), 10, scores.data());
  for (int t = 0; t < 10; ++t) {
    codec.dequantize(codes.data() + t * codec.code_bytes(), norms.data() + 2 * t, back.data());
    double ref = 0;
    for (int i = 0; i < d; ++i) ref += double(q[i]) * back[i];
    EXPECT_NEAR(scores[t], ref, 1e-4 * (1 + std::abs(ref)));
  }
  EXPECT_THROW(ProdCodec({d, 0}), InvalidArgument);
  EXPECT_THROW(ProdCodec({d, 9}), InvalidArgument);
  EXPECT_THROW(ProdCodec({0, 3}), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::quant
