// Cache policy (docs/design.md, "Cache policy"): which cache each layer gets. The decision is a
// plan (plan_layer_caches) that every backend builds its caches from, so the CPU and the GPU
// apply one rule:
//  - layers that are not softmax attention are never quantized: linear attention keeps a
//    recurrent state, latent (MLA) layers a dense cache of their latent rows, KV-shared layers
//    read their owner's cache (so its K/V are stored, and compressed, once);
//  - sliding-window layers: a rotating dense cache, never quantized;
//  - the last attention layer (the cache the last attending layer reads, which need not be the
//    last layer) stays dense unless ResolvedKV::last_layer_dense is false;
//  - other (global) layers: the scheme of ResolvedKV, dense until quantized_kv_start tokens,
//    with that layer's bits (layer_kv: the allocation rule, then the kv_layer_bits overrides,
//    which may also make a layer dense or quantize the last one).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/turboquant_kv_cache.h"
#include "kv/uniform_kv_cache.h"

namespace turbokv {

enum class LayerCacheKind { kDense, kRotating, kTurboQuant, kUniform, kRecurrent, kShared };
const char* layer_cache_kind_name(LayerCacheKind kind);  // "dense", "rotating", ...

// The cache one layer gets.
struct LayerCachePlan {
  LayerCacheKind kind = LayerCacheKind::kDense;
  LayerStateKind layer = LayerStateKind::kAttention;  // what the layer keeps (LayerSpec::kind)
  int shared_with = -1;                               // kShared: the owner layer
  RecurrentShape recurrent{};                         // kRecurrent
  int kv_heads = 0;
  int head_dim = 0;
  int window = 0;                  // kRotating: the sliding window
  TurboQuantKVConfig turboquant;   // kTurboQuant
  UniformKVConfig uniform;         // kUniform
  int64_t quantized_kv_start = 0;  // quantized kinds: > 0 stays dense until it holds this many
};

// One plan per layer. Throws InvalidArgument for bad shapes or KV settings (the bits and dims
// are checked here, not when a staged cache converts).
std::vector<LayerCachePlan> plan_layer_caches(const std::vector<LayerSpec>& layers,
                                              const ResolvedKV& kv);

// The CPU caches of a plan. Dense and rotating caches store f16 (kv_bits none -> a dense fp16
// cache), or dense_dtype when given (kF32 for exact comparisons against fp32 references).
LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv);
LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv,
                              KVDType dense_dtype);
LayerCaches make_layer_caches(const std::vector<LayerCachePlan>& plan, KVDType dense_dtype);

// The layer whose cache the last attending layer reads: the last attention layer, or the
// owner of a trailing KV-shared layer; -1 when no layer attends over a KV cache.
int last_attention_cache(const std::vector<LayerSpec>& layers);

// A one-line summary such as "6 recurrent, 1 turboquant, 1 dense".
std::string summarize_plan(const std::vector<LayerCachePlan>& plan);

// Builds one sequence's caches for a KV choice: make_layer_caches on the CPU, device caches on
// a GPU (the engine, perplexity and benchmarks take one; tests inject fakes).
using CacheFactory = std::function<LayerCaches(const ResolvedKV&)>;

// The cache configurations a ResolvedKV selects.
TurboQuantKVConfig turboquant_config(const ResolvedKV& kv);
UniformKVConfig uniform_config(const ResolvedKV& kv);

// The settings of global attention layer `layer` of n_layers (last_attention: the cache the last
// attending layer reads): none for a dense layer (dense scheme, the last one under
// last_layer_dense, a "dense" override), else kv with that layer's key and value bits (the
// "keys" allocation swaps the split in every layer but 0; overrides win).
std::optional<ResolvedKV> layer_kv(const ResolvedKV& kv, int layer, int n_layers,
                                   bool last_attention);

}  // namespace turbokv
