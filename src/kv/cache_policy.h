// Cache policy (docs/design.md, "Cache policy"): which cache type each layer gets.
//  - sliding-window layers: RotatingKVCache, never quantized;
//  - the last layer stays dense unless ResolvedKV::last_layer_dense is false;
//  - other (global) layers: the scheme of ResolvedKV, dense until quantized_kv_start tokens.
#pragma once

#include <vector>

#include "kv/kv_cache.h"
#include "kv/turboquant_kv_cache.h"
#include "kv/uniform_kv_cache.h"

namespace turbokv {

// Dense and rotating caches store f16 (kv_bits none -> a dense fp16 cache).
LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv);

// Same, with the element type of the dense and rotating caches chosen by the caller (kF32 for
// exact comparisons against fp32 reference logits).
LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv,
                              KVDType dense_dtype);

// The cache configurations a ResolvedKV selects.
TurboQuantKVConfig turboquant_config(const ResolvedKV& kv);
UniformKVConfig uniform_config(const ResolvedKV& kv);

}  // namespace turbokv
