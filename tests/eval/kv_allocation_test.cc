// TurboQuant bit allocation: the greedy rule on hand-made tables (kv/kv_allocation.h), and the
// whole measurement on a real (tiny, random-weight) model within its budget.
#include "kv/kv_allocation.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "kv/cache_policy.h"
#include "kv/kv_resolve.h"
#include "tests/model/test_util.h"

namespace turbokv {
namespace {

// A layer of one KV head, d = 128, with the given estimates per candidate.
LayerDistortion layer(int index, std::vector<double> keys, std::vector<double> values) {
  LayerDistortion l;
  l.layer = index;
  l.kv_heads = 1;
  l.head_dim = 128;
  l.bits = allocation_candidates();
  l.key_error = std::move(keys);
  l.value_error = std::move(values);
  return l;
}

TEST(AllocateBits, CostsAreCodesPlusFp16Norms) {
  EXPECT_EQ(turboquant_cost_bits(3, 128), 3.125);
  EXPECT_EQ(turboquant_cost_bits(3.5, 128), 3.75);  // two norms
  EXPECT_EQ(allocation_candidates(), (std::vector<double>{2, 2.5, 3, 3.5, 4, 4.5, 5, 6}));
}

TEST(AllocateBits, SpendsTheBudgetWhereTheErrorDrops) {
  const std::vector<double> flat(8, 1.0);
  // Only layer 0's keys gain, and only at 4 bits (2.125 -> 4.125: 2 bits per element more).
  const std::vector<LayerDistortion> layers = {layer(0, {8, 8, 8, 8, 0, 0, 0, 0}, flat),
                                               layer(1, flat, flat)};
  // Four units of 128 elements: a budget of 2.125 + 2/4 affords the move exactly ...
  auto bits = allocate_bits(layers, 2.625);
  ASSERT_EQ(bits.size(), 2u);
  EXPECT_EQ(layer_bits_text(bits), "0:4/2,1:2/2");
  // ... a little less does not, and moves without gain are never taken.
  EXPECT_EQ(layer_bits_text(allocate_bits(layers, 2.6)), "0:2/2,1:2/2");
  EXPECT_THROW(allocate_bits(layers, 2.0), InvalidArgument);  // below the cheapest
}

TEST(AllocateBits, TakesTheBestGainPerBitFirst) {
  const std::vector<double> flat(8, 1.0);
  // Layer 0 values: 2 -> 2.5 costs 0.625 and gains 2 (3.2 per bit); layer 1 keys: 2 -> 3 costs
  // 1.0 and gains 3 (3 per bit). Extra budget 1.0 bit on one unit: only the first fits after it.
  const std::vector<LayerDistortion> layers = {layer(0, flat, {4, 2, 2, 2, 2, 2, 2, 2}),
                                               layer(1, {3, 3, 0, 0, 0, 0, 0, 0}, flat)};
  EXPECT_EQ(layer_bits_text(allocate_bits(layers, 2.125 + 1.0 / 4)), "0:2/2.5,1:2/2");
  // With 1.625 extra both fit.
  EXPECT_EQ(layer_bits_text(allocate_bits(layers, 2.125 + 1.625 / 4)), "0:2/2.5,1:3/2");
}

// The tiny llama (2 layers, 2 KV heads, d 16), every layer TurboQuant K3/V4 centered: the
// allocation measures on the reference prompt and spends at most the plain setting's bits.
TEST(AllocateKV, MeasuresOnTheFirstChunkWithinTheBudget) {
  std::unique_ptr<Model> model = Model::load(testing::fixture("hf-tiny/llama"));
  const SafetensorsFile ref =
      SafetensorsFile::open(testing::fixture("hf-tiny/llama/reference.safetensors"));
  const std::vector<int64_t> ids64 = SafetensorsFile::to_i64(ref.at("input_ids"));
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());
  KVOptions o;
  o.kv_bits = 3.5;
  o.last_layer_dense = false;
  o.kv_centering = "keys";
  o.kv_allocation = "auto";
  const ResolvedKV kv = resolve_kv_options(o);
  int forwards = 0;
  const auto forward = [&](const std::vector<LayerCaches*>& caches,
                           const std::vector<float*>& logits) {
    std::vector<Model::Chunk> pass;
    for (size_t i = 0; i < caches.size(); ++i) {
      pass.push_back({ids.data(), int(ids.size()), caches[i], logits[i], true});
    }
    model->forward(pass);
    forwards += int(caches.size());
  };
  const int vocab = model->info().vocab_size;
  const ResolvedKV allocated =
      allocate_kv(model->layer_specs(), kv, int(ids.size()), vocab, forward);
  EXPECT_EQ(forwards, 1 + 2 * 2);  // dense, then each layer's keys and values alone
  EXPECT_EQ(allocated.allocation, KVAllocation::kNone);
  ASSERT_EQ(allocated.layer_bits.size(), 2u);
  double cost = 0;
  for (const LayerKVBits& b : allocated.layer_bits) {
    cost += turboquant_cost_bits(b.key_bits, 16) + turboquant_cost_bits(b.value_bits, 16);
  }
  const double plain = turboquant_cost_bits(3, 16) + turboquant_cost_bits(4, 16);
  EXPECT_LE(cost / 4, plain / 2 + 1e-12);
  // The same chunk gives the same allocation, and the caches take it.
  forwards = 0;
  EXPECT_EQ(layer_bits_text(
                allocate_kv(model->layer_specs(), kv, int(ids.size()), vocab, forward).layer_bits),
            layer_bits_text(allocated.layer_bits));
  const std::vector<LayerCachePlan> plan = plan_layer_caches(model->layer_specs(), allocated);
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].turboquant.key_bits, allocated.layer_bits[i].key_bits);
    EXPECT_EQ(plan[i].turboquant.value_bits, allocated.layer_bits[i].value_bits);
    EXPECT_TRUE(plan[i].turboquant.center_keys);
  }
  // A dense request is returned as it is, without a forward.
  forwards = 0;
  EXPECT_EQ(allocate_kv(model->layer_specs(), ResolvedKV{}, int(ids.size()), vocab, forward).scheme,
            KVScheme::kDense);
  EXPECT_EQ(forwards, 0);
}

}  // namespace
}  // namespace turbokv
