// Cache policy (docs/design.md, "Cache policy"): the plan, and the CPU caches built from it
// (behind a StagedKVCache when quantized_kv_start > 0).
#include "kv/cache_policy.h"

#include "core/error.h"
#include "kv/dense_kv_cache.h"
#include "kv/staged_kv_cache.h"

namespace turbokv {

const char* layer_cache_kind_name(LayerCacheKind kind) {
  switch (kind) {
    case LayerCacheKind::kDense: return "dense";
    case LayerCacheKind::kRotating: return "rotating";
    case LayerCacheKind::kTurboQuant: return "turboquant";
    case LayerCacheKind::kUniform: return "uniform";
  }
  return "?";
}

TurboQuantKVConfig turboquant_config(const ResolvedKV& kv) {
  return TurboQuantKVConfig{kv.key_bits, kv.value_bits, kv.seed, kv.norm_correction};
}

UniformKVConfig uniform_config(const ResolvedKV& kv) {
  return UniformKVConfig{static_cast<int>(kv.key_bits), static_cast<int>(kv.value_bits),
                         kv.group_size};
}

namespace {

std::unique_ptr<KVCache> make_quantized(const LayerCachePlan& p) {
  if (p.kind == LayerCacheKind::kTurboQuant) {
    return std::make_unique<TurboQuantKVCache>(p.kv_heads, p.head_dim, p.turboquant);
  }
  return std::make_unique<UniformKVCache>(p.kv_heads, p.head_dim, p.uniform);
}

StagedKVCache::Convert make_converter(const LayerCachePlan& p) {
  if (p.kind == LayerCacheKind::kTurboQuant) {
    const TurboQuantKVConfig config = p.turboquant;
    return [config](const DenseKVCache& dense) -> std::unique_ptr<KVCache> {
      return TurboQuantKVCache::convert_from(dense, config);
    };
  }
  const UniformKVConfig config = p.uniform;
  return [config](const DenseKVCache& dense) -> std::unique_ptr<KVCache> {
    return UniformKVCache::convert_from(dense, config);
  };
}

}  // namespace

std::vector<LayerCachePlan> plan_layer_caches(const std::vector<LayerSpec>& layers,
                                              const ResolvedKV& kv) {
  if (kv.quantized_kv_start < 0) {
    throw InvalidArgument(str_cat("quantized_kv_start ", kv.quantized_kv_start, " must be >= 0"),
                          "quantized_kv_start");
  }
  std::vector<LayerCachePlan> plan;
  plan.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& spec = layers[i];
    check_kv_shape(spec.kv_heads, spec.head_dim);
    const bool last = i + 1 == layers.size();
    LayerCachePlan p;
    p.kv_heads = spec.kv_heads;
    p.head_dim = spec.head_dim;
    if (spec.sliding_window > 0) {
      p.kind = LayerCacheKind::kRotating;
      p.window = spec.sliding_window;
    } else if (kv.scheme == KVScheme::kDense || (last && kv.last_layer_dense)) {
      p.kind = LayerCacheKind::kDense;
    } else {
      p.kind = kv.scheme == KVScheme::kTurboQuant ? LayerCacheKind::kTurboQuant
                                                  : LayerCacheKind::kUniform;
      p.turboquant = turboquant_config(kv);
      p.uniform = uniform_config(kv);
      p.quantized_kv_start = kv.quantized_kv_start;
      make_quantized(p);  // validates bits and dims now, not at a staged conversion
    }
    plan.push_back(p);
  }
  return plan;
}

LayerCaches make_layer_caches(const std::vector<LayerCachePlan>& plan, KVDType dense_dtype) {
  LayerCaches caches;
  caches.reserve(plan.size());
  for (const LayerCachePlan& p : plan) {
    switch (p.kind) {
      case LayerCacheKind::kRotating:
        caches.push_back(
            std::make_unique<RotatingKVCache>(p.kv_heads, p.head_dim, p.window, dense_dtype));
        break;
      case LayerCacheKind::kDense:
        caches.push_back(std::make_unique<DenseKVCache>(p.kv_heads, p.head_dim, dense_dtype));
        break;
      case LayerCacheKind::kTurboQuant:
      case LayerCacheKind::kUniform:
        if (p.quantized_kv_start > 0) {
          caches.push_back(std::make_unique<StagedKVCache>(
              p.kv_heads, p.head_dim, dense_dtype, p.quantized_kv_start, make_converter(p)));
        } else {
          caches.push_back(make_quantized(p));
        }
        break;
    }
  }
  return caches;
}

LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv) {
  return make_layer_caches(layers, kv, KVDType::kF16);
}

LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv,
                              KVDType dense_dtype) {
  return make_layer_caches(plan_layer_caches(layers, kv), dense_dtype);
}

}  // namespace turbokv
