// Cache policy: which cache each layer gets, quantized_kv_start conversion, capacity steps.
#include "kv/cache_policy.h"

#include <gtest/gtest.h>

#include <cstring>

#include "attention_harness.h"
#include "core/error.h"
#include "kv/kv_resolve.h"
#include "kv/staged_kv_cache.h"

namespace turbokv {
namespace {

ResolvedKV resolved(const KVOptions& options) {
  return resolve_kv_options(options);
}

KVOptions bits(double kv_bits) {
  KVOptions o;
  o.kv_bits = kv_bits;
  return o;
}

const std::vector<LayerSpec> kLayers = {{2, 64, 0}, {2, 64, 16}, {2, 64, 0}, {2, 64, 0}};

std::vector<std::string> types(const LayerCaches& caches) {
  std::vector<std::string> names;
  for (const auto& c : caches) names.push_back(c->type_name());
  return names;
}

TEST(CachePolicy, DenseSchemeKeepsSlidingLayersRotating) {
  EXPECT_EQ(types(make_layer_caches(kLayers, ResolvedKV{}, KVDType::kF32)),
            (std::vector<std::string>{"dense-f32", "rotating", "dense-f32", "dense-f32"}));
  EXPECT_EQ(make_layer_caches(kLayers, ResolvedKV{})[0]->type_name(), "dense-f16");
}

TEST(CachePolicy, QuantizedSchemesSkipSlidingAndLastLayer) {
  EXPECT_EQ(types(make_layer_caches(kLayers, resolved(bits(3.5)))),
            (std::vector<std::string>{"turboquant", "rotating", "turboquant", "dense-f16"}));
  EXPECT_EQ(types(make_layer_caches(kLayers, resolved(bits(4)))),
            (std::vector<std::string>{"uniform", "rotating", "uniform", "dense-f16"}));
  KVOptions all = bits(3.5);
  all.last_layer_dense = false;
  EXPECT_EQ(types(make_layer_caches(kLayers, resolved(all))),
            (std::vector<std::string>{"turboquant", "rotating", "turboquant", "turboquant"}));
}

TEST(CachePolicy, ResolvedBitsReachTheCaches) {
  KVOptions o = bits(3.5);
  o.kv_key_bits = 2.5;
  o.seed = 9;
  const auto config = turboquant_config(resolved(o));
  EXPECT_EQ(config.key_bits, 2.5);
  EXPECT_EQ(config.value_bits, 4);
  EXPECT_EQ(config.seed, 9u);
  KVOptions u = bits(4);
  u.kv_value_bits = 2;
  u.kv_group_size = 32;
  const auto uniform = uniform_config(resolved(u));
  EXPECT_EQ(uniform.key_bits, 4);
  EXPECT_EQ(uniform.value_bits, 2);
  EXPECT_EQ(uniform.group_size, 32);
}

TEST(CachePolicy, QuantizedKvStartConvertsTheWholeHistoryOnce) {
  KVOptions o = bits(3);
  o.kv_quant_scheme = "turboquant";
  o.quantized_kv_start = 40;
  const ResolvedKV kv = resolved(o);
  const std::vector<LayerSpec> layer = {{2, 64, 0}, {2, 64, 0}};
  LayerCaches caches = make_layer_caches(layer, kv, KVDType::kF32);
  KVCache& staged = *caches[0];
  TurboQuantKVCache direct(2, 64, turboquant_config(kv));
  const size_t row = 2 * 64;
  const auto k = testing::random_normal(50 * row, 1);
  const auto v = testing::random_normal(50 * row, 2);
  staged.append(k.data(), v.data(), 30);
  EXPECT_EQ(staged.type_name(), "dense-f32");
  EXPECT_EQ(staged.nbytes(), 30u * row * 2 * 4);
  staged.append(k.data() + 30 * row, v.data() + 30 * row, 12);  // reaches 42 >= 40
  EXPECT_EQ(staged.type_name(), "turboquant");
  staged.append(k.data() + 42 * row, v.data() + 42 * row, 8);
  direct.append(k.data(), v.data(), 50);
  EXPECT_EQ(staged.size(), 50);
  EXPECT_EQ(staged.nbytes(), direct.nbytes());
  const auto q = testing::random_normal(8 * 64, 3);
  std::vector<float> a(8 * 64), b(8 * 64);
  staged.attend(q.data(), 1, AttentionParams{8, 0.125f, 0, 0}, a.data());
  direct.attend(q.data(), 1, AttentionParams{8, 0.125f, 0, 0}, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(CachePolicy, CapacityGrowsInSteps) {
  DenseKVCache dense(2, 64, KVDType::kF16);
  const auto kv = testing::random_normal(300 * 2 * 64, 1);
  dense.append(kv.data(), kv.data(), 1);
  EXPECT_EQ(dense.rows().capacity(), 256);
  dense.append(kv.data(), kv.data(), 256);
  EXPECT_EQ(dense.rows().capacity(), 512);
  EXPECT_EQ(dense.nbytes(), 257u * 2 * 64 * 2 * 2);  // held tokens, not capacity
  TurboQuantKVCache tq(2, 64, {3, 4, 0, true});
  tq.append(kv.data(), kv.data(), 300);
  EXPECT_EQ(tq.key_rows().capacity(), 512);
}

TEST(CachePolicy, PlanNamesEachLayersCacheAndItsSettings) {
  KVOptions o = bits(3.5);
  o.quantized_kv_start = 100;
  const std::vector<LayerCachePlan> plan = plan_layer_caches(kLayers, resolved(o));
  ASSERT_EQ(plan.size(), kLayers.size());
  const LayerCacheKind expected[] = {LayerCacheKind::kTurboQuant, LayerCacheKind::kRotating,
                                     LayerCacheKind::kTurboQuant, LayerCacheKind::kDense};
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].kind, expected[i]) << "layer " << i;
    EXPECT_EQ(plan[i].kv_heads, 2);
    EXPECT_EQ(plan[i].head_dim, 64);
  }
  EXPECT_EQ(plan[1].window, 16);
  EXPECT_EQ(plan[0].turboquant.key_bits, 3);
  EXPECT_EQ(plan[0].turboquant.value_bits, 4);
  EXPECT_EQ(plan[0].quantized_kv_start, 100);
  EXPECT_STREQ(layer_cache_kind_name(plan[1].kind), "rotating");
  // The CPU caches follow the plan: staged (dense until 100 tokens), rotating, staged, dense.
  EXPECT_EQ(types(make_layer_caches(plan, KVDType::kF16)),
            (std::vector<std::string>{"dense-f16", "rotating", "dense-f16", "dense-f16"}));
}

TEST(CachePolicy, LayerOverridesAndSoftCappedLayers) {
  KVOptions o = bits(3.5);
  o.kv_layer_bits = "0:4/5,-2:dense,-1:2/3";  // -2: layer 2 of 4
  o.kv_allocation = "none";                   // layer 1 keeps the request's K3/V4
  o.kv_centering = "both";
  o.kv_sink_tokens = 2;
  std::vector<LayerSpec> layers = {{2, 64, 0}, {2, 64, 0}, {2, 64, 0}, {2, 64, 0}};
  layers[3].logit_softcap = 30.0f;
  const std::vector<LayerCachePlan> plan = plan_layer_caches(layers, resolved(o));
  EXPECT_EQ(plan[0].kind, LayerCacheKind::kTurboQuant);
  EXPECT_EQ(plan[0].turboquant.key_bits, 4);
  EXPECT_EQ(plan[0].turboquant.value_bits, 5);
  EXPECT_EQ(plan[1].turboquant.key_bits, 3);  // the request's bits
  EXPECT_EQ(plan[2].kind, LayerCacheKind::kDense);
  // The last layer: an override beats last_layer_dense; soft-capped, its keys stay uncentered.
  EXPECT_EQ(plan[3].kind, LayerCacheKind::kTurboQuant);
  EXPECT_EQ(plan[3].turboquant.key_bits, 2);
  EXPECT_FALSE(plan[3].turboquant.center_keys);
  EXPECT_TRUE(plan[3].turboquant.center_values);
  EXPECT_TRUE(plan[0].turboquant.center_keys);
  EXPECT_EQ(plan[0].turboquant.sink_tokens, 2);
  o.kv_layer_bits = "0:4/5";
  o.kv_bits = 4;
  o.kv_quant_scheme = "uniform";
  o.kv_centering.reset();
  o.kv_sink_tokens.reset();
  o.kv_allocation.reset();
  o.kv_hadamard = true;
  const std::vector<LayerCachePlan> uniform = plan_layer_caches(layers, resolved(o));
  EXPECT_EQ(uniform[0].uniform.value_bits, 5);
  EXPECT_TRUE(uniform[1].uniform.hadamard);
  EXPECT_EQ(uniform[3].kind, LayerCacheKind::kDense);
}

// The defaults of a bare kv_bits (kv/kv_resolve.h): for a fractional width the "keys" split in
// every layer but layer 0, nothing centered; every lever off is plain TurboQuant.
TEST(CachePolicy, DefaultLeversAndPlainTurboQuant) {
  const std::vector<LayerSpec> layers = {{2, 64, 0}, {2, 64, 0}, {2, 64, 0}, {2, 64, 0}};
  const ResolvedKV defaults = resolved(bits(3.5));
  EXPECT_FALSE(defaults.center_keys);
  EXPECT_FALSE(defaults.center_values);
  EXPECT_EQ(defaults.sink_tokens, 0);
  EXPECT_EQ(defaults.allocation, KVAllocation::kKeys);
  const std::vector<LayerCachePlan> plan = plan_layer_caches(layers, defaults);
  EXPECT_EQ(plan[0].turboquant.key_bits, 3);  // layer 0 keeps keys floor, values ceil
  EXPECT_EQ(plan[0].turboquant.value_bits, 4);
  for (int i : {1, 2}) {
    EXPECT_EQ(plan[i].turboquant.key_bits, 4) << i;
    EXPECT_EQ(plan[i].turboquant.value_bits, 3) << i;
    EXPECT_FALSE(plan[i].turboquant.center_keys) << i;
  }
  EXPECT_EQ(plan[3].kind, LayerCacheKind::kDense);
  // Integer widths and explicit key or value bits keep the split they ask for.
  KVOptions four = bits(4);
  four.kv_quant_scheme = "turboquant";
  EXPECT_EQ(resolved(four).allocation, KVAllocation::kNone);
  KVOptions explicit_bits = bits(3.5);
  explicit_bits.kv_key_bits = 3;
  EXPECT_EQ(resolved(explicit_bits).allocation, KVAllocation::kNone);
  // Every lever off: the configuration of plain TurboQuant in every layer.
  KVOptions plain = bits(3.5);
  plain.kv_centering = "none";
  plain.kv_allocation = "none";
  for (const LayerCachePlan& p : plan_layer_caches(layers, resolved(plain))) {
    if (p.kind != LayerCacheKind::kTurboQuant) continue;
    EXPECT_EQ(p.turboquant.key_bits, 3);
    EXPECT_EQ(p.turboquant.value_bits, 4);
    EXPECT_FALSE(p.turboquant.center_keys || p.turboquant.center_values);
    EXPECT_EQ(p.turboquant.sink_tokens, 0);
  }
}

TEST(CachePolicy, BadOptionsAreInvalidArgument) {
  ResolvedKV kv = resolved(bits(3.5));
  kv.quantized_kv_start = -1;
  EXPECT_THROW(make_layer_caches(kLayers, kv), InvalidArgument);
  ResolvedKV bad_bits = resolved(bits(3.5));
  bad_bits.key_bits = 2.25;
  EXPECT_THROW(make_layer_caches(kLayers, bad_bits), InvalidArgument);
  EXPECT_THROW(make_layer_caches({{0, 64, 0}}, ResolvedKV{}), InvalidArgument);
}

}  // namespace
}  // namespace turbokv
