// Perplexity scoring: log-softmax, KL and top-1 on hand-computed rows, and run_perplexity's
// chunking (docs/design.md, "Contracts") against one forward per chunk scored independently.
#include "eval/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/safetensors.h"
#include "kv/kv_resolve.h"
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

// Bits per element from the format: tiny llama, 2 layers of 2 KV heads, d 16, C 7 tokens.
// Layer 0 TurboQuant K3/V4 with centered keys: per token and head 6 + 2 bytes (keys: 16 x 3 bits
// and a norm) + 8 + 2 (values), plus the key means 2 x 16 x 2 bytes; layer 1 dense fp16.
TEST(RunPerplexity, BitsCountEverythingStoredForTheWholeModel) {
  std::unique_ptr<Model> model = Model::load(testing::fixture("hf-tiny/llama"));
  const SafetensorsFile ref =
      SafetensorsFile::open(testing::fixture("hf-tiny/llama/reference.safetensors"));
  const std::vector<int64_t> ids64 = SafetensorsFile::to_i64(ref.at("input_ids"));
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());
  KVOptions o;
  o.kv_bits = 3.5;
  o.kv_centering = "keys";
  PerplexityOptions options;
  options.context = 7;
  options.max_chunks = 2;
  options.kv = resolve_kv_options(o);
  const PerplexityResult r = run_perplexity(*model, ids, options);
  const double quant_bytes = 7.0 * 2 * (8 + 10) + 2 * 16 * 2;  // per chunk
  const double dense_bytes = 7.0 * 2 * 16 * 2 * 2;
  const double elements = 7.0 * 2 * 16 * 2;  // per layer per chunk
  EXPECT_DOUBLE_EQ(r.kv_bits_quantized_layers, 8 * quant_bytes / elements);
  EXPECT_DOUBLE_EQ(r.kv_bits_effective, 8 * (quant_bytes + dense_bytes) / (2 * elements));
}

// A sweep scores every setting against one dense pass as run_perplexity scores each alone.
TEST(RunPerplexitySweep, EqualsOneRunPerSetting) {
  std::unique_ptr<Model> model = Model::load(testing::fixture("hf-tiny/llama"));
  const SafetensorsFile ref =
      SafetensorsFile::open(testing::fixture("hf-tiny/llama/reference.safetensors"));
  const std::vector<int64_t> ids64 = SafetensorsFile::to_i64(ref.at("input_ids"));
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());
  PerplexityOptions options;
  options.context = 11;
  options.tokens_per_forward = 4;
  std::vector<ResolvedKV> kvs;
  for (const char* flags : {"3.5", "2.5", "4"}) {
    KVOptions o;
    o.kv_bits = parse_kv_bits(flags);
    o.kv_quant_scheme = "turboquant";
    o.last_layer_dense = false;
    kvs.push_back(resolve_kv_options(o));
  }
  KVOptions u;
  u.kv_bits = 4;
  u.kv_hadamard = true;
  kvs.push_back(resolve_kv_options(u));
  const std::vector<PerplexityResult> sweep = run_perplexity_sweep(*model, ids, options, kvs);
  ASSERT_EQ(sweep.size(), kvs.size());
  for (size_t i = 0; i < kvs.size(); ++i) {
    options.kv = kvs[i];
    const PerplexityResult one = run_perplexity(*model, ids, options);
    EXPECT_EQ(sweep[i].stats.tokens, one.stats.tokens);
    EXPECT_NEAR(sweep[i].stats.nll_sum, one.stats.nll_sum, 1e-6 * one.stats.nll_sum) << i;
    EXPECT_NEAR(sweep[i].stats.kld_sum, one.stats.kld_sum, 1e-6 + 1e-4 * one.stats.kld_sum) << i;
    EXPECT_EQ(sweep[i].kv_bits_effective, one.kv_bits_effective);
    EXPECT_GT(sweep[i].stats.kld_sum, 0) << i;
  }
  EXPECT_THROW(run_perplexity_sweep(*model, ids, options, {}), InvalidArgument);
  EXPECT_THROW(run_perplexity_sweep(*model, ids, options, {ResolvedKV{}}), InvalidArgument);
}

}  // namespace
}  // namespace turbokv
