// Layer kinds and the cache policy per family: with --kv-bits 3.5 only global attention layers
// other than the last attention layer are compressed; sliding layers rotate dense; linear
// attention keeps an untouched RecurrentState; MLA latents stay dense; KV-shared layers store
// nothing. Every layer's cache type is checked, and a forward through those caches stays finite.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "eval/perplexity.h"
#include "kv/cache_policy.h"
#include "kv/kv_resolve.h"
#include "kv/recurrent_state.h"
#include "model/config.h"
#include "model/model.h"
#include "test_util.h"

namespace turbokv {
namespace {

using testing::fixture;

ResolvedKV kv_bits(double bits, bool last_layer_dense = true) {
  KVOptions o;
  o.kv_bits = bits;
  o.last_layer_dense = last_layer_dense;
  return resolve_kv_options(o);
}

std::vector<std::string> cache_types(const LayerCaches& caches) {
  std::vector<std::string> types;
  for (const auto& c : caches) types.push_back(c->type_name());
  return types;
}

// Runs the first tokens of the reference prompt through caches; all logits finite.
void expect_finite_forward(const Model& model, LayerCaches& caches) {
  const int V = model.info().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 11) % V);
  std::vector<float> logits(ids.size() * size_t(V));
  Model::Chunk prefill{ids.data(), 32, &caches, logits.data(), true};
  model.forward({&prefill, 1});
  for (int i = 32; i < 40; ++i) {
    Model::Chunk step{ids.data() + i, 1, &caches, logits.data() + size_t(i) * V, true};
    model.forward({&step, 1});
  }
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST(LayerKinds, Qwen3_5LinearLayersKeepAnUntouchedRecurrentState) {
  const ModelConfig c = load_model_config(fixture("hf-tiny/qwen3_5_text"));
  using K = LayerKind;
  EXPECT_EQ(c.layer_kind,
            (std::vector<K>{K::kLinearAttention, K::kLinearAttention, K::kLinearAttention,
                            K::kAttention, K::kLinearAttention, K::kLinearAttention,
                            K::kLinearAttention, K::kAttention}));
  EXPECT_TRUE(c.attention_output_gate);
  EXPECT_EQ(c.linear.conv_channels(), 2 * 2 * 16 + 4 * 16);

  std::unique_ptr<Model> model = Model::load(fixture("hf-tiny/qwen3_5_text"));
  LayerCaches caches = make_layer_caches(model->layer_specs(), kv_bits(3.5));
  // Layer 7 is the last attention layer (and here also the last layer): dense. Layer 3 is the
  // only other global attention layer: TurboQuant.
  EXPECT_EQ(cache_types(caches),
            (std::vector<std::string>{"recurrent", "recurrent", "recurrent", "turboquant",
                                      "recurrent", "recurrent", "recurrent", "dense-f16"}));
  expect_finite_forward(*model, caches);
  // The recurrent state: fixed size, not in the K/V bytes, not trimmable, holds no rows.
  auto* state = dynamic_cast<RecurrentState*>(caches[0].get());
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->size(), 40);
  EXPECT_EQ(state->nbytes(), 0u);
  EXPECT_EQ(state->state_bytes(), (size_t(3 * 128) + size_t(4 * 16 * 16)) * sizeof(float));
  EXPECT_THROW(state->trim(1), Unsupported);
  EXPECT_NO_THROW(state->trim(0));
  const float row[64] = {};
  EXPECT_THROW(state->append(row, row, 1), Unsupported);
  EXPECT_EQ(caches[3]->size(), 40);
}

// The transformers-made variants: Gemma 4 keys-equal-values global layers (one KV head of 32, no
// v_proj) and the Qwen3.5 MoE (every MLP sparse, its one attention layer the last one).
TEST(LayerKinds, KeysEqualValuesAndQwen3_5MoeCacheTypes) {
  const ModelConfig g = load_model_config(fixture("hf-tiny/gemma4_text_k_eq_v"));
  EXPECT_TRUE(g.attention[2].values_from_keys && g.attention[5].values_from_keys);
  EXPECT_FALSE(g.attention[0].values_from_keys);
  EXPECT_EQ(g.attention[2].num_kv_heads, 1);
  EXPECT_EQ(g.attention[2].head_dim, 32);
  std::unique_ptr<Model> gemma = Model::load(fixture("hf-tiny/gemma4_text_k_eq_v"));
  LayerCaches gc = make_layer_caches(gemma->layer_specs(), kv_bits(3.5, false));
  EXPECT_EQ(cache_types(gc), (std::vector<std::string>{"rotating", "rotating", "turboquant",
                                                       "rotating", "shared", "shared"}));
  expect_finite_forward(*gemma, gc);

  const ModelConfig q = load_model_config(fixture("hf-tiny/qwen3_5_moe_text"));
  EXPECT_EQ(q.num_experts, 4);
  EXPECT_TRUE(q.shared_expert_gate);
  EXPECT_EQ(q.moe_layer, std::vector<bool>(4, true));
  std::unique_ptr<Model> qwen = Model::load(fixture("hf-tiny/qwen3_5_moe_text"));
  LayerCaches qc = make_layer_caches(qwen->layer_specs(), kv_bits(3.5));
  EXPECT_EQ(cache_types(qc), (std::vector<std::string>{"recurrent", "recurrent", "recurrent",
                                                       "dense-f16"}));
  expect_finite_forward(*qwen, qc);
}

TEST(LayerKinds, LastAttentionLayerIsNotTheLastLayerIndex) {
  // A hybrid whose last layer is linear: the last attention layer (5) stays dense.
  std::vector<LayerSpec> specs(7);
  for (int l : {0, 1, 2, 4, 6}) {
    specs[size_t(l)].kind = LayerStateKind::kRecurrent;
    specs[size_t(l)].recurrent = RecurrentShape{8, 3, 2, 4, 4};
  }
  for (int l : {3, 5}) specs[size_t(l)] = LayerSpec{2, 64, 0};
  EXPECT_EQ(last_attention_cache(specs), 5);
  const LayerCaches caches = make_layer_caches(specs, kv_bits(3.5));
  EXPECT_EQ(cache_types(caches),
            (std::vector<std::string>{"recurrent", "recurrent", "recurrent", "turboquant",
                                      "recurrent", "dense-f16", "recurrent"}));
}

TEST(LayerKinds, Gemma4SharedLayersReadTheirOwnersCacheCompressedOnce) {
  const ModelConfig c = load_model_config(fixture("hf-tiny/gemma4_text"));
  EXPECT_EQ(c.sliding_window, (std::vector<int>{8, 8, 0, 8, 8, 0}));
  EXPECT_EQ(c.attention[2].head_dim, 32);
  EXPECT_EQ(c.attention[0].head_dim, 16);
  EXPECT_EQ(c.attention[4].kv_source, 3);
  EXPECT_EQ(c.attention[5].kv_source, 2);
  EXPECT_EQ(c.attention[3].kv_source, -1);
  EXPECT_FLOAT_EQ(c.attention_scale, 1.0f);
  EXPECT_EQ(c.per_layer_input_dim, 16);

  std::unique_ptr<Model> model = Model::load(fixture("hf-tiny/gemma4_text"));
  // Layer 5 (the last layer) attends through layer 2's cache, so layer 2 is the last attention
  // cache and stays dense.
  LayerCaches caches = make_layer_caches(model->layer_specs(), kv_bits(3.5));
  EXPECT_EQ(cache_types(caches), (std::vector<std::string>{"rotating", "rotating", "dense-f16",
                                                           "rotating", "shared", "shared"}));
  expect_finite_forward(*model, caches);
  // Without the dense last layer, layer 2 is TurboQuant and layer 5 reads those codes: one
  // compressed copy, the shared layer holds no bytes.
  LayerCaches compressed = make_layer_caches(model->layer_specs(), kv_bits(3.5, false));
  EXPECT_EQ(cache_types(compressed), (std::vector<std::string>{"rotating", "rotating", "turboquant",
                                                               "rotating", "shared", "shared"}));
  expect_finite_forward(*model, compressed);
  const auto* shared = dynamic_cast<const SharedKVCache*>(compressed[5].get());
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(&shared->owner(), compressed[2].get());
  EXPECT_EQ(shared->nbytes(), 0u);
  EXPECT_GT(compressed[2]->nbytes(), 0u);
  EXPECT_EQ(compressed[5]->size(), 40);
}

TEST(LayerKinds, DeepseekLatentCachesStayDense) {
  const ModelConfig c = load_model_config(fixture("hf-tiny/deepseek_v3"));
  EXPECT_EQ(c.layer_kind, std::vector<LayerKind>(3, LayerKind::kMla));
  EXPECT_EQ(c.mla.latent_dim(), 32 + 16);
  EXPECT_EQ(c.moe_layer, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.shared_expert_intermediate, 32);

  std::unique_ptr<Model> model = Model::load(fixture("hf-tiny/deepseek_v3"));
  LayerCaches caches = make_layer_caches(model->layer_specs(), kv_bits(3.5, false));
  EXPECT_EQ(cache_types(caches), std::vector<std::string>(3, "dense-f16"));
  for (const LayerCachePlan& p : plan_layer_caches(model->layer_specs(), kv_bits(3.5, false))) {
    EXPECT_EQ(p.layer, LayerStateKind::kLatent);
    EXPECT_EQ(p.kind, LayerCacheKind::kDense);
  }
  expect_finite_forward(*model, caches);
  EXPECT_EQ(caches[0]->kv_heads(), 1);
  EXPECT_EQ(caches[0]->head_dim(), 48);
}

TEST(LayerKinds, PlanSummaryNamesEveryKind) {
  std::unique_ptr<Model> qwen = Model::load(fixture("hf-tiny/qwen3_5_text"));
  const std::vector<LayerCachePlan> plan = plan_layer_caches(qwen->layer_specs(), kv_bits(3.5));
  EXPECT_EQ(summarize_plan(plan), "6 recurrent, 1 turboquant, 1 dense");
  EXPECT_EQ(plan[0].recurrent.heads, 4);
  std::unique_ptr<Model> gemma = Model::load(fixture("hf-tiny/gemma4_text"));
  const std::vector<LayerCachePlan> g = plan_layer_caches(gemma->layer_specs(), kv_bits(3.5));
  EXPECT_EQ(summarize_plan(g), "3 rotating, 1 dense, 2 shared");
  EXPECT_EQ(g[4].shared_with, 3);
  EXPECT_EQ(g[5].shared_with, 2);
  std::unique_ptr<Model> ds = Model::load(fixture("hf-tiny/deepseek_v3"));
  EXPECT_EQ(summarize_plan(plan_layer_caches(ds->layer_specs(), kv_bits(3.5))), "3 latent dense");
}

// Perplexity with --kv-bits 3.5 (the last attention layer quantized too, so each family has
// compressed layers where it has global attention): finite, and the KL divergence from the dense
// run is printed for the record (random weights: the number only shows the path runs).
class KvPerplexity : public ::testing::TestWithParam<const char*> {};

TEST_P(KvPerplexity, RunsFiniteWithTurboQuant) {
  std::unique_ptr<Model> model = Model::load(fixture(std::string("hf-tiny/") + GetParam()));
  const int V = model->info().vocab_size;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 2 * 64 + 1; ++i) tokens.push_back((i * 131 + 7) % V);
  PerplexityOptions options;
  options.context = 64;
  options.tokens_per_forward = 24;
  options.kv = kv_bits(3.5, false);
  const PerplexityResult r = run_perplexity(*model, tokens, options);
  EXPECT_EQ(r.stats.tokens, 2 * 64);
  EXPECT_TRUE(std::isfinite(r.stats.ppl()) && std::isfinite(r.stats.dense_ppl()));
  EXPECT_TRUE(std::isfinite(r.stats.kld_mean()) && r.stats.kld_mean() >= 0);
  std::printf("%s: ppl dense %.4f, turboquant 3.5 %.4f, KLD %.3g, top-1 agreement %.4f\n",
              GetParam(), r.stats.dense_ppl(), r.stats.ppl(), r.stats.kld_mean(),
              r.stats.top1_agreement());
}

INSTANTIATE_TEST_SUITE_P(NewKinds, KvPerplexity,
                         ::testing::Values("qwen3_5_text", "gemma4_text", "deepseek_v3",
                                           "gemma4_text_k_eq_v", "qwen3_5_moe_text"));

}  // namespace
}  // namespace turbokv
