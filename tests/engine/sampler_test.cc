// Sampler: greedy, seeded reproducibility, and each filter against distributions computed by hand.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"

namespace turbokv {
namespace {

std::vector<float> log_probs(std::vector<double> p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

std::map<int32_t, double> frequencies(const SamplingOptions& o, const std::vector<float>& logits,
                                      int draws) {
  Sampler sampler(o);
  std::map<int32_t, double> freq;
  for (int i = 0; i < draws; ++i) {
    auto l = logits;
    freq[sampler.sample(l, {})] += 1.0 / draws;
  }
  return freq;
}

TEST(Sampler, TemperatureZeroIsArgmaxWithLowestIdOnTies) {
  Sampler sampler(SamplingOptions{});
  std::vector<float> logits = {0.1f, 3.0f, -2.0f, 3.0f};
  EXPECT_EQ(sampler.sample(logits, {}), 1);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  const auto logits = log_probs({0.25, 0.25, 0.25, 0.25});
  auto draw = [&](uint64_t seed) {
    SamplingOptions o;
    o.temperature = 1.0;
    o.seed = seed;
    Sampler s(o);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto l = logits;
      out.push_back(s.sample(l, {}));
    }
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, TemperatureOneFollowsTheSoftmax) {
  SamplingOptions o;
  o.temperature = 1.0;
  auto f = frequencies(o, log_probs({0.5, 0.3, 0.2}), 40000);
  EXPECT_NEAR(f[0], 0.5, 0.015);
  EXPECT_NEAR(f[1], 0.3, 0.015);
  EXPECT_NEAR(f[2], 0.2, 0.015);
}

TEST(Sampler, TemperatureTwoFlattens) {
  SamplingOptions o;
  o.temperature = 2.0;
  // p^(1/2) normalised: sqrt(.5)=.7071, sqrt(.3)=.5477, sqrt(.2)=.4472 -> sum 1.7020
  auto f = frequencies(o, log_probs({0.5, 0.3, 0.2}), 40000);
  EXPECT_NEAR(f[0], 0.7071 / 1.7020, 0.015);
  EXPECT_NEAR(f[2], 0.4472 / 1.7020, 0.015);
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 2;
  auto f = frequencies(o, log_probs({0.2, 0.5, 0.3}), 40000);
  EXPECT_EQ(f.count(0), 0u);
  EXPECT_NEAR(f[1], 0.5 / 0.8, 0.015);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingTheMass) {
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_p = 0.6;  // 0.5 < 0.6 <= 0.5 + 0.3: ids 0 and 1 stay
  auto f = frequencies(o, log_probs({0.5, 0.3, 0.2}), 40000);
  EXPECT_EQ(f.count(2), 0u);
  EXPECT_NEAR(f[0], 0.5 / 0.8, 0.015);
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  SamplingOptions o;
  o.temperature = 1.0;
  o.min_p = 0.5;  // floor 0.25: 0.3 stays, 0.2 goes
  auto f = frequencies(o, log_probs({0.5, 0.3, 0.2}), 40000);
  EXPECT_EQ(f.count(2), 0u);
  EXPECT_NEAR(f[1], 0.3 / 0.8, 0.015);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingOptions o;
  o.repetition_penalty = 1.5;
  Sampler sampler(o);
  std::vector<int32_t> history = {0, 2};
  std::vector<float> logits = {2.0f, 1.9f, -1.0f};
  EXPECT_EQ(sampler.sample(logits, history), 1);
  EXPECT_FLOAT_EQ(logits[0], 2.0f / 1.5f);
  EXPECT_FLOAT_EQ(logits[2], -1.5f);
  o.repetition_context = 1;  // only token 2 is seen
  Sampler recent(o);
  logits = {2.0f, 1.9f, -1.0f};
  EXPECT_EQ(recent.sample(logits, history), 0);
}

TEST(Sampler, MaskedIdsAreNeverChosen) {
  const std::vector<int32_t> masked = {1, 4, 5};  // 4, 5: a padded tail; 1: a hole
  std::vector<float> best_masked = {0.0f, 9.0f, 1.0f, 0.5f, 9.0f, 9.0f};
  {
    Sampler greedy(SamplingOptions{}, masked);
    auto l = best_masked;
    EXPECT_EQ(greedy.sample(l, {}), 2);
  }
  SamplingOptions o;
  o.temperature = 2.0;
  for (int top_k : {0, 1, 2, 6}) {
    o.top_k = top_k;
    Sampler sampler(o, masked);
    for (int i = 0; i < 2000; ++i) {
      auto l = best_masked;
      const int32_t t = sampler.sample(l, {});
      ASSERT_TRUE(t == 0 || t == 2 || t == 3) << t << " top_k " << top_k;
    }
  }
}

TEST(Sampler, NonFiniteLogitsNeverBreakTheDraw) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_p = 0.9;
  const std::vector<int32_t> masked = {3};
  Sampler sampler(o, masked);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> l = {nan, 1.0f, inf, 5.0f, nan};
    EXPECT_EQ(sampler.sample(l, {}), 2);
    std::vector<float> all_nan(64, nan);
    const int32_t t = sampler.sample(all_nan, {});
    EXPECT_EQ(t, 0);
    std::vector<float> only_masked_finite = {-inf, -inf, -inf, 1.0f};
    EXPECT_EQ(sampler.sample(only_masked_finite, {}), 0);
  }
  std::vector<float> l = {nan, 1.0f, 2.0f};
  EXPECT_EQ(argmax(l), 2);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  SamplingOptions o;
  o.presence_penalty = 0.5;
  o.frequency_penalty = 0.25;
  Sampler sampler(o);
  // history: prompt {1, 1, 1} then generated {0, 0, 2}.
  const std::vector<int32_t> history = {1, 1, 1, 0, 0, 2};
  std::vector<float> logits = {2.0f, 1.0f, 1.0f, 0.5f};
  sampler.sample(logits, history, /*n_generated=*/3);
  EXPECT_FLOAT_EQ(logits[0], 2.0f - 0.5f - 2 * 0.25f);
  EXPECT_FLOAT_EQ(logits[1], 1.0f);  // only in the prompt
  EXPECT_FLOAT_EQ(logits[2], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[3], 0.5f);
  // Negative penalties favour repeats (OpenAI allows [-2, 2]).
  o.presence_penalty = -2;
  o.frequency_penalty = 0;
  Sampler favour(o);
  logits = {0.0f, 1.0f, 0.0f};
  EXPECT_EQ(favour.sample(logits, history, 3), 0);
}

TEST(Sampler, LogitBiasIsAddedAndMinus100Bans) {
  SamplingOptions o;
  o.logit_bias = {{0, -100.0}, {2, 3.5}};
  Sampler sampler(o);
  std::vector<float> logits = {5.0f, 4.0f, 1.0f};
  EXPECT_EQ(sampler.sample(logits, {}), 2);
  EXPECT_FLOAT_EQ(logits[0], -95.0f);
  EXPECT_FLOAT_EQ(logits[2], 4.5f);
}

TEST(Sampler, LogprobsAreTheLogSoftmaxBeforeTheRules) {
  const std::vector<int32_t> masked = {3};
  SamplingOptions o;
  o.temperature = 0.5;
  o.repetition_penalty = 2.0;
  o.logit_bias = {{1, 50.0}};
  Sampler sampler(o, masked);
  std::vector<float> logits = log_probs({0.5, 0.3, 0.2});
  logits.push_back(9.0f);  // masked: not a token, no probability
  float logprob = 0;
  std::vector<TokenLogprob> top;
  const int32_t t =
      sampler.sample_with_logprobs(logits, std::vector<int32_t>{0}, 1, 2, &logprob, &top);
  EXPECT_EQ(t, 1);  // the bias decides the draw, not the logprobs
  EXPECT_NEAR(logprob, std::log(0.3), 1e-6);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].token, 0);
  EXPECT_NEAR(top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(top[1].token, 1);
  EXPECT_NEAR(top[1].logprob, std::log(0.3), 1e-6);
}

TEST(Sampler, OutOfRangeOptionsAreInvalidArguments) {
  auto bad = [](auto set) {
    SamplingOptions o;
    set(o);
    return o;
  };
  for (const auto& o :
       {bad([](auto& o) { o.temperature = -1; }), bad([](auto& o) { o.temperature = NAN; }),
        bad([](auto& o) { o.top_k = -2; }), bad([](auto& o) { o.top_p = 0; }),
        bad([](auto& o) { o.top_p = 1.5; }), bad([](auto& o) { o.min_p = 2; }),
        bad([](auto& o) { o.repetition_penalty = 0; }),
        bad([](auto& o) { o.presence_penalty = 2.5; }),
        bad([](auto& o) { o.frequency_penalty = -3; }), bad([](auto& o) {
          o.logit_bias = {{1, 101.0}};
        }),
        bad([](auto& o) {
          o.logit_bias = {{-1, 1.0}};
        })}) {
    EXPECT_THROW(Sampler{o}, InvalidArgument);
  }
}

}  // namespace
}  // namespace turbokv
