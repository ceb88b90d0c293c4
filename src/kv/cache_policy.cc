// Cache policy (docs/design.md, "TurboQuant"): sliding-window layers get a RotatingKVCache, the
// last layer stays dense unless ResolvedKV::last_layer_dense is false, global layers get the
// resolved scheme, behind a StagedKVCache when quantized_kv_start > 0.
#include "kv/cache_policy.h"

#include "core/error.h"
#include "kv/dense_kv_cache.h"
#include "kv/staged_kv_cache.h"
#include "kv/turboquant_kv_cache.h"
#include "kv/uniform_kv_cache.h"

namespace turbokv {

TurboQuantKVConfig turboquant_config(const ResolvedKV& kv) {
  return TurboQuantKVConfig{kv.key_bits, kv.value_bits, kv.seed, kv.norm_correction};
}

UniformKVConfig uniform_config(const ResolvedKV& kv) {
  return UniformKVConfig{static_cast<int>(kv.key_bits), static_cast<int>(kv.value_bits),
                         kv.group_size};
}

namespace {

std::unique_ptr<KVCache> make_quantized(const LayerSpec& spec, const ResolvedKV& kv) {
  if (kv.scheme == KVScheme::kTurboQuant) {
    return std::make_unique<TurboQuantKVCache>(spec.kv_heads, spec.head_dim, turboquant_config(kv));
  }
  return std::make_unique<UniformKVCache>(spec.kv_heads, spec.head_dim, uniform_config(kv));
}

StagedKVCache::Convert make_converter(const ResolvedKV& kv) {
  if (kv.scheme == KVScheme::kTurboQuant) {
    const TurboQuantKVConfig config = turboquant_config(kv);
    return [config](const DenseKVCache& dense) -> std::unique_ptr<KVCache> {
      return TurboQuantKVCache::convert_from(dense, config);
    };
  }
  const UniformKVConfig config = uniform_config(kv);
  return [config](const DenseKVCache& dense) -> std::unique_ptr<KVCache> {
    return UniformKVCache::convert_from(dense, config);
  };
}

}  // namespace

LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv) {
  return make_layer_caches(layers, kv, KVDType::kF16);
}

LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv,
                              KVDType dense_dtype) {
  if (kv.quantized_kv_start < 0) {
    throw InvalidArgument(str_cat("quantized_kv_start ", kv.quantized_kv_start, " must be >= 0"));
  }
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
    } else if (kv.quantized_kv_start > 0) {
      make_quantized(spec, kv);  // validates bits and dims now, not at the conversion
      caches.push_back(std::make_unique<StagedKVCache>(spec.kv_heads, spec.head_dim, dense_dtype,
                                                       kv.quantized_kv_start, make_converter(kv)));
    } else {
      caches.push_back(make_quantized(spec, kv));
    }
  }
  return caches;
}

}  // namespace turbokv
