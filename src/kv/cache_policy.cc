// Cache policy (DESIGN §2): sliding-window layers get a RotatingKVCache, the last layer stays
// dense unless ResolvedKV::last_layer_dense is false, global layers get the resolved scheme.
#include "kv/cache_policy.h"

#include "core/error.h"
#include "kv/dense_kv_cache.h"

namespace turbokv {

LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv) {
  return make_layer_caches(layers, kv, KVDType::kF16);
}

LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv,
                              KVDType dense_dtype) {
  LayerCaches caches;
  caches.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& spec = layers[i];
    const bool last = i + 1 == layers.size();
    if (spec.sliding_window > 0) {
      caches.push_back(std::make_unique<RotatingKVCache>(spec.kv_heads, spec.head_dim,
                                                         spec.sliding_window, dense_dtype));
    } else if (kv.scheme == KVScheme::kDense || (last && kv.last_layer_dense)) {
      caches.push_back(std::make_unique<DenseKVCache>(spec.kv_heads, spec.head_dim, dense_dtype));
    } else {
      throw Unsupported(
          str_cat("KV scheme ", kv_scheme_name(kv.scheme), " is not available yet in this build"));
    }
  }
  return caches;
}

}  // namespace turbokv
