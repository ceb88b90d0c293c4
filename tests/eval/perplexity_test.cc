// Perplexity scoring: log-softmax, KL and top-1 on hand-computed rows, and run_perplexity's
// chunking (docs/design.md, "Contracts") against one forward per chunk scored independently.
#include "eval/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/safetensors.h"
#include "tests/model/test_util.h"

namespace turbokv {
namespace {

TEST(ScoreLogits, HandComputedRow) {
  // Scored row log-probs: log(e^x / Σ) with x = {0, ln 3} -> p = {1/4, 3/4}.
  const float logits[] = {0.0f, float(std::log(3.0))};
  // Dense row: p = {1/2, 1/2}.
  const float dense[] = {5.0f, 5.0f};
  const int32_t target[] = {1};
  PerplexityStats s;
  score_logits(logits, dense, target, 1, 2, s);
  EXPECT_EQ(s.tokens, 1);
  EXPECT_NEAR(s.nll_sum, -std::log(0.75), 1e-7);
  EXPECT_NEAR(s.dense_nll_sum, -std::log(0.5), 1e-7);
  // KL(dense || scored) = 1/2 ln(1/2 / 1/4) + 1/2 ln(1/2 / 3/4)
  EXPECT_NEAR(s.kld_sum, 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  EXPECT_EQ(s.top1_agree, 0);  // argmax 1 vs 0 (first of a tie)
  EXPECT_NEAR(s.ppl(), 1 / 0.75, 1e-6);
}

TEST(RunPerplexity, ChunksAreFreshSequencesScoredOnTheirNextTokens) {
  std::unique_ptr<Model> model = Model::load(testing::fixture("hf-tiny/llama"));
  const SafetensorsFile ref =
      SafetensorsFile::open(testing::fixture("hf-tiny/llama/reference.safetensors"));
  const std::vector<int64_t> ids64 = SafetensorsFile::to_i64(ref.at("input_ids"));
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());  // 24 tokens
  const int V = model->info().vocab_size;

  // C = 7: chunks [0, 8), [7, 15), [14, 22); 22..23 are left over.
  PerplexityStats want;
  for (int chunk = 0; chunk < 3; ++chunk) {
    LayerCaches caches = make_layer_caches(model->layer_specs(), ResolvedKV{});
    std::vector<float> logits(size_t(7) * V);
    Model::Chunk c{ids.data() + chunk * 7, 7, &caches, logits.data(), true};
    model->forward({&c, 1});
    score_logits(logits.data(), nullptr, ids.data() + chunk * 7 + 1, 7, V, want);
  }
  PerplexityOptions options;
  options.context = 7;
  options.tokens_per_forward = 3;  // pieces of a chunk go through the caches in turn
  int64_t calls = 0;
  const PerplexityResult r = run_perplexity(
      *model, ids, options, [&](int64_t, int64_t, const PerplexityStats&) { ++calls; });
  EXPECT_EQ(r.chunks, 3);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(r.stats.tokens, 21);
  EXPECT_FALSE(r.quantized);
  EXPECT_NEAR(r.stats.ppl(), want.ppl(), 1e-4 * want.ppl());

  options.max_chunks = 2;
  EXPECT_EQ(run_perplexity(*model, ids, options).stats.tokens, 14);
  options.context = 24;
  EXPECT_THROW(run_perplexity(*model, ids, options), InvalidArgument);  // needs 25 tokens
  options.context = 0;
  EXPECT_THROW(run_perplexity(*model, ids, options), InvalidArgument);
}

}  // namespace
}  // namespace turbokv
