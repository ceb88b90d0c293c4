// Cache policy (docs/design.md, "Cache policy"): the plan, and the CPU caches built from it
// (behind a StagedKVCache when quantized_kv_start > 0; RecurrentState and SharedKVCache for
// linear-attention and KV-shared layers).
#include "kv/cache_policy.h"

#include <algorithm>

#include "core/error.h"
#include "kv/dense_kv_cache.h"
#include "kv/recurrent_state.h"
#include "kv/staged_kv_cache.h"

namespace turbokv {

const char* layer_cache_kind_name(LayerCacheKind kind) {
  switch (kind) {
    case LayerCacheKind::kDense:
      return "dense";
    case LayerCacheKind::kRotating:
      return "rotating";
    case LayerCacheKind::kTurboQuant:
      return "turboquant";
    case LayerCacheKind::kUniform:
      return "uniform";
    case LayerCacheKind::kRecurrent:
      return "recurrent";
    case LayerCacheKind::kShared:
      return "shared";
  }
  return "?";
}

TurboQuantKVConfig turboquant_config(const ResolvedKV& kv) {
  TurboQuantKVConfig c{kv.key_bits, kv.value_bits, kv.seed, kv.norm_correction};
  c.unbiased_norm = kv.unbiased_norm;
  c.center_keys = kv.center_keys;
  c.center_values = kv.center_values;
  c.sink_tokens = kv.sink_tokens;
  c.recent_tokens = kv.recent_tokens;
  return c;
}

UniformKVConfig uniform_config(const ResolvedKV& kv) {
  return UniformKVConfig{static_cast<int>(kv.key_bits), static_cast<int>(kv.value_bits),
                         kv.group_size, kv.hadamard, kv.seed};
}

std::optional<ResolvedKV> layer_kv(const ResolvedKV& kv, int layer, int n_layers,
                                   bool last_attention) {
  if (kv.scheme == KVScheme::kDense) return std::nullopt;
  bool dense = last_attention && kv.last_layer_dense;
  ResolvedKV r = kv;
  if (kv.allocation == KVAllocation::kKeys && layer != 0) {
    r.key_bits = std::max(kv.key_bits, kv.value_bits);
    r.value_bits = std::min(kv.key_bits, kv.value_bits);
  }
  for (const LayerKVBits& bits : kv.layer_bits) {
    if (bits.layer != layer && bits.layer != layer - n_layers) continue;
    dense = bits.dense;
    if (!dense) {
      r.key_bits = bits.key_bits;
      r.value_bits = bits.value_bits;
    }
  }
  if (dense) return std::nullopt;
  return r;
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
  if (kv.allocation == KVAllocation::kAuto) {
    throw InvalidArgument(
        "kv_allocation 'auto' measures each layer on a sequence's first chunk, which only "
        "`turbokv perplexity` does; allowed here: 'none', 'keys' or explicit kv_layer_bits",
        "kv_allocation");
  }
  std::vector<LayerCachePlan> plan;
  plan.reserve(layers.size());
  const int last_attention = last_attention_cache(layers);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& spec = layers[i];
    const bool last = int(i) == last_attention;
    LayerCachePlan p;
    p.layer = spec.kind;
    p.kv_heads = spec.kv_heads;
    p.head_dim = spec.head_dim;
    if (spec.kind == LayerStateKind::kRecurrent) {
      p.kind = LayerCacheKind::kRecurrent;  // untouched by every scheme
      p.recurrent = spec.recurrent;
      plan.push_back(p);
      continue;
    }
    check_kv_shape(spec.kv_heads, spec.head_dim);
    if (spec.kind == LayerStateKind::kShared) {
      const int owner = spec.shared_with;
      if (owner < 0 || size_t(owner) >= i ||
          layers[size_t(owner)].kind != LayerStateKind::kAttention) {
        throw InvalidArgument(str_cat("layer ", i, " shares the cache of layer ", owner,
                                      ", which must be an earlier attention layer"));
      }
      p.kind = LayerCacheKind::kShared;
      p.shared_with = owner;
    } else if (spec.kind == LayerStateKind::kLatent) {
      p.kind = LayerCacheKind::kDense;  // MLA latents stay dense, untouched by every scheme
    } else if (spec.sliding_window > 0) {
      p.kind = LayerCacheKind::kRotating;
      p.window = spec.sliding_window;
    } else if (const auto layer_bits = layer_kv(kv, int(i), int(layers.size()), last);
               !layer_bits) {
      p.kind = LayerCacheKind::kDense;
    } else {
      p.kind = kv.scheme == KVScheme::kTurboQuant ? LayerCacheKind::kTurboQuant
                                                  : LayerCacheKind::kUniform;
      p.turboquant = turboquant_config(*layer_bits);
      // Key centering shifts every score of a query by the same amount, which soft-capping
      // does not forgive: such layers keep their keys uncentered.
      if (spec.logit_softcap > 0) p.turboquant.center_keys = false;
      p.uniform = uniform_config(*layer_bits);
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
      case LayerCacheKind::kRecurrent:
        caches.push_back(std::make_unique<RecurrentState>(p.recurrent));
        break;
      case LayerCacheKind::kShared:
        if (p.shared_with < 0 || size_t(p.shared_with) >= caches.size()) {
          throw InvalidArgument(str_cat("a shared layer's owner ", p.shared_with,
                                        " must come before it in the plan"));
        }
        caches.push_back(
            std::make_unique<SharedKVCache>(caches[size_t(p.shared_with)].get(), p.shared_with));
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

int last_attention_cache(const std::vector<LayerSpec>& layers) {
  for (size_t i = layers.size(); i-- > 0;) {
    if (layers[i].kind == LayerStateKind::kAttention) return int(i);
    if (layers[i].kind == LayerStateKind::kShared) return layers[i].shared_with;
  }
  return -1;
}

std::string summarize_plan(const std::vector<LayerCachePlan>& plan) {
  std::vector<std::pair<std::string, int>> counts;
  for (const LayerCachePlan& p : plan) {
    std::string name = layer_cache_kind_name(p.kind);
    if (p.layer == LayerStateKind::kLatent) name = "latent dense";
    auto it =
        std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == name; });
    if (it == counts.end()) {
      counts.emplace_back(name, 1);
    } else {
      ++it->second;
    }
  }
  std::string out;
  for (const auto& [name, n] : counts) out += str_cat(out.empty() ? "" : ", ", n, " ", name);
  return out;
}

LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv) {
  return make_layer_caches(layers, kv, KVDType::kF16);
}

LayerCaches make_layer_caches(const std::vector<LayerSpec>& layers, const ResolvedKV& kv,
                              KVDType dense_dtype) {
  return make_layer_caches(plan_layer_caches(layers, kv), dense_dtype);
}

}  // namespace turbokv
