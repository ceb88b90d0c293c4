// Cache policy (DESIGN §2 "Cache policy"): which cache type each layer gets.
//  - sliding-window layers: RotatingKVCache, never quantized;
//  - the last layer stays dense unless ResolvedKV::last_layer_dense is false;
//  - other (global) layers: the scheme of ResolvedKV, dense until quantized_kv_start tokens.
#pragma once

#include <vector>

#include "kv/kv_cache.h"

namespace turbokv {

LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv);

}  // namespace turbokv
