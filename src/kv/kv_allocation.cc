// Bit allocation from the first chunk's attention distortion (kv_allocation.h).
#include "kv/kv_allocation.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log_softmax.h"
#include "kv/cache_policy.h"

namespace turbokv {
namespace {

// x [n, kv_heads, d] token-major -> [kv_heads, n, d] head-major (what DenseKVView reads).
std::vector<float> head_major(const std::vector<float>& x, int64_t n, int kv_heads, int d) {
  std::vector<float> out(x.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < kv_heads; ++h) {
      std::copy_n(&x[size_t((t * kv_heads + h) * d)], d, &out[size_t((h * n + t) * d)]);
    }
  }
  return out;
}

DenseKVView f32_view(const std::vector<float>& k, const std::vector<float>& v, int64_t n,
                     int kv_heads, int d) {
  DenseKVView view;
  view.dtype = KVDType::kF32;
  view.k = k.data();
  view.v = v.data();
  view.kv_heads = kv_heads;
  view.head_dim = d;
  view.head_stride = n;
  view.n_tokens = n;
  view.first_pos = 0;
  return view;
}

// Attention of every recorded call over view, rows concatenated: [Σ n_q · n_heads, d].
std::vector<float> attend_calls(const ProbeKVCache& probe, const DenseKVView& view) {
  std::vector<float> out;
  for (const ProbeKVCache::Call& call : probe.calls()) {
    const size_t offset = out.size();
    out.resize(offset + call.q.size());
    attention_dense(view, AttentionQueries{call.q.data(), call.n_q, call.first_pos}, call.params,
                    out.data() + offset);
  }
  return out;
}

// sum |got - want|^2 / sum |want|^2 over every element, in order, in double.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = double(got[i]) - double(want[i]);
    diff += e * e;
    norm += double(want[i]) * double(want[i]);
  }
  return norm > 0 ? diff / norm : 0;
}

enum class TensorRole { kKeys, kValues };

// A layer's cache with one tensor through a TurboQuant cache (dequantized) and the other exact;
// attention runs densely (f32) on the two.
class OneTensorCodedCache : public KVCache {
 public:
  OneTensorCodedCache(int kv_heads, int head_dim, const TurboQuantKVConfig& config,
                      TensorRole coded)
      : coded_(kv_heads, head_dim, config),
        mixed_(kv_heads, head_dim, KVDType::kF32),
        role_(coded) {}

  std::string type_name() const override { return "probe"; }
  int kv_heads() const override { return mixed_.kv_heads(); }
  int head_dim() const override { return mixed_.head_dim(); }
  int64_t size() const override { return mixed_.size(); }
  void append(const float* k, const float* v, int n_tokens) override {
    check_append(k, v, n_tokens);
    if (n_tokens == 0) return;
    const int64_t first = coded_.size();
    coded_.append(k, v, n_tokens);
    std::vector<float> ck, cv;  // [n_tokens, kv_heads, head_dim]
    coded_.to_dense().copy_tokens(first, n_tokens, &ck, &cv);
    if (role_ == TensorRole::kKeys) {
      mixed_.append(ck.data(), v, n_tokens);
    } else {
      mixed_.append(k, cv.data(), n_tokens);
    }
  }
  void trim(int64_t) override { throw Unsupported("a probe cache cannot be trimmed"); }
  size_t nbytes() const override { return mixed_.nbytes(); }
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override {
    mixed_.attend(q, n_q, params, out);
  }
  int64_t calibration_tokens() const override { return coded_.calibration_tokens(); }

 private:
  TurboQuantKVCache coded_;
  DenseKVCache mixed_;
  TensorRole role_;
};

}  // namespace

const std::vector<double>& allocation_candidates() {
  static const std::vector<double> candidates = {2, 2.5, 3, 3.5, 4, 4.5, 5, 6};
  return candidates;
}

double turboquant_cost_bits(double bits, int head_dim) {
  const int norms = std::floor(bits) == bits ? 1 : 2;
  return bits + 16.0 * norms / head_dim;
}

ProbeKVCache::ProbeKVCache(int kv_heads, int head_dim)
    : dense_(kv_heads, head_dim, KVDType::kF32) {}

void ProbeKVCache::append(const float* k, const float* v, int n_tokens) {
  check_append(k, v, n_tokens);
  if (n_tokens == 0) return;
  dense_.append(k, v, n_tokens);
  appends_.push_back(n_tokens);
}

void ProbeKVCache::trim(int64_t) {
  throw Unsupported("a probe cache records one chunk and cannot be trimmed");
}

void ProbeKVCache::attend(const float* q, int n_q, const AttentionParams& params,
                          float* out) const {
  check_attend(q, n_q, params, out);
  dense_.attend(q, n_q, params, out);
  Call call;
  call.q.assign(q, q + size_t(n_q) * params.n_heads * head_dim());
  call.n_q = n_q;
  call.first_pos = size() - n_q;
  call.params = params;
  calls_.push_back(std::move(call));
}

LayerDistortion measure_distortion(const ProbeKVCache& probe, int layer,
                                   const TurboQuantKVConfig& base) {
  const int kv_heads = probe.kv_heads(), d = probe.head_dim();
  const int64_t n = probe.size();
  LayerDistortion result;
  result.layer = layer;
  result.kv_heads = kv_heads;
  result.head_dim = d;
  result.bits = allocation_candidates();
  std::vector<float> k, v;  // [n, kv_heads, d]
  probe.dense().copy_tokens(0, n, &k, &v);
  const std::vector<float> exact_k = head_major(k, n, kv_heads, d);
  const std::vector<float> exact_v = head_major(v, n, kv_heads, d);
  const std::vector<float> exact = attend_calls(probe, f32_view(exact_k, exact_v, n, kv_heads, d));
  const size_t row = size_t(kv_heads) * d;
  for (double bits : result.bits) {
    TurboQuantKVConfig config = base;
    config.key_bits = config.value_bits = bits;
    TurboQuantKVCache cache(kv_heads, d, config);
    int64_t done = 0;
    for (int piece : probe.appends()) {
      cache.append(&k[done * row], &v[done * row], piece);
      done += piece;
    }
    std::vector<float> coded_k, coded_v;
    cache.to_dense().copy_tokens(0, n, &coded_k, &coded_v);
    const std::vector<float> qk = head_major(coded_k, n, kv_heads, d);
    const std::vector<float> qv = head_major(coded_v, n, kv_heads, d);
    result.key_error.push_back(
        relative_error(attend_calls(probe, f32_view(qk, exact_v, n, kv_heads, d)), exact));
    result.value_error.push_back(
        relative_error(attend_calls(probe, f32_view(exact_k, qv, n, kv_heads, d)), exact));
  }
  return result;
}

std::vector<LayerKVBits> allocate_bits(const std::vector<LayerDistortion>& layers,
                                       double budget_bits) {
  struct Unit {
    const LayerDistortion* layer;
    const std::vector<double>* error;
    size_t at = 0;
    double weight = 0;  // elements per token: kv_heads * head_dim
    double cost(size_t i) const { return turboquant_cost_bits(layer->bits[i], layer->head_dim); }
  };
  std::vector<Unit> units;
  double weights = 0, spent = 0;
  for (const LayerDistortion& l : layers) {
    for (const auto* error : {&l.key_error, &l.value_error}) {
      Unit u{&l, error, 0, double(l.kv_heads) * l.head_dim};
      units.push_back(u);
      weights += u.weight;
      spent += u.weight * u.cost(0);
    }
  }
  if (units.empty()) return {};
  const double budget = budget_bits * weights;
  if (spent > budget * (1 + 1e-12)) {
    throw InvalidArgument(str_cat("kv_budget=", budget_bits, " is below the cheapest allocation (",
                                  spent / weights, " bits per element)"),
                          "kv_budget");
  }
  for (;;) {
    Unit* best = nullptr;
    size_t best_to = 0;
    double best_gain = 0;
    for (Unit& u : units) {
      for (size_t to = u.at + 1; to < u.layer->bits.size(); ++to) {
        const double extra = u.weight * (u.cost(to) - u.cost(u.at));
        if (spent + extra > budget * (1 + 1e-12)) break;
        const double gain = ((*u.error)[u.at] - (*u.error)[to]) / extra;
        if (gain > best_gain) {
          best = &u;
          best_to = to;
          best_gain = gain;
        }
      }
    }
    if (best == nullptr) break;
    spent += best->weight * (best->cost(best_to) - best->cost(best->at));
    best->at = best_to;
  }
  std::vector<LayerKVBits> out;
  for (size_t i = 0; i < units.size(); i += 2) {
    LayerKVBits bits;
    bits.layer = units[i].layer->layer;
    bits.key_bits = units[i].layer->bits[units[i].at];
    bits.value_bits = units[i + 1].layer->bits[units[i + 1].at];
    out.push_back(bits);
  }
  return out;
}

ResolvedKV allocate_kv(const std::vector<LayerSpec>& layers, const ResolvedKV& kv, int n_tokens,
                       int vocab, const ChunkForward& forward) {
  ResolvedKV result = kv;
  if (kv.allocation != KVAllocation::kAuto || kv.scheme != KVScheme::kTurboQuant) return result;
  result.allocation = KVAllocation::kNone;
  if (n_tokens < 1) throw InvalidArgument("kv_allocation: the first chunk has no tokens");
  const std::vector<LayerCachePlan> plan = plan_layer_caches(layers, result);
  std::vector<size_t> coded;  // the TurboQuant layers
  double plain_cost = 0, weights = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const LayerCachePlan& p = plan[i];
    if (p.kind != LayerCacheKind::kTurboQuant) continue;
    coded.push_back(i);
    const double w = double(p.kv_heads) * p.head_dim;
    plain_cost += w * (turboquant_cost_bits(p.turboquant.key_bits, p.head_dim) +
                       turboquant_cost_bits(p.turboquant.value_bits, p.head_dim));
    weights += 2 * w;
  }
  if (coded.empty()) return result;
  // The plan with every TurboQuant layer exact (f32), and one of them replaced by `layer`.
  const auto exact_caches = [&](size_t replaced, std::unique_ptr<KVCache> layer) {
    LayerCaches caches = make_layer_caches(plan, KVDType::kF16);
    for (size_t i : coded) {
      caches[i] = i == replaced
                      ? std::move(layer)
                      : std::make_unique<ProbeKVCache>(plan[i].kv_heads, plan[i].head_dim);
    }
    return caches;
  };
  const size_t n_logits = size_t(n_tokens) * vocab;
  std::vector<float> dense_logits(n_logits);  // [n_tokens, vocab]
  LayerCaches probes = exact_caches(plan.size(), nullptr);
  forward({&probes}, {dense_logits.data()});

  // The scale K_u of every unit: units in order (layer, keys), (layer, values), a few forwards
  // per batch.
  constexpr size_t kBatch = 4;
  const double ref_bits = allocation_candidates().front();
  std::vector<double> scale;
  std::vector<double> dense_logp, logp;
  for (size_t first = 0; first < 2 * coded.size(); first += kBatch) {
    const size_t count = std::min(kBatch, 2 * coded.size() - first);
    std::vector<LayerCaches> perturbed(count);
    std::vector<std::vector<float>> logits(count, std::vector<float>(n_logits));
    std::vector<LayerCaches*> cache_ptrs;
    std::vector<float*> logit_ptrs;
    for (size_t j = 0; j < count; ++j) {
      const size_t unit = first + j, layer = coded[unit / 2];
      TurboQuantKVConfig config = plan[layer].turboquant;
      config.key_bits = config.value_bits = ref_bits;
      perturbed[j] =
          exact_caches(layer, std::make_unique<OneTensorCodedCache>(
                                  plan[layer].kv_heads, plan[layer].head_dim, config,
                                  unit % 2 == 0 ? TensorRole::kKeys : TensorRole::kValues));
      cache_ptrs.push_back(&perturbed[j]);
      logit_ptrs.push_back(logits[j].data());
    }
    forward(cache_ptrs, logit_ptrs);
    for (size_t j = 0; j < count; ++j) {
      double kl = 0;
      for (int t = 0; t < n_tokens; ++t) {
        log_softmax(&dense_logits[size_t(t) * vocab], vocab, dense_logp);
        log_softmax(&logits[j][size_t(t) * vocab], vocab, logp);
        kl += kl_divergence(dense_logp, logp);
      }
      scale.push_back(kl / n_tokens);
    }
  }

  std::vector<LayerDistortion> estimated;
  for (size_t c = 0; c < coded.size(); ++c) {
    const size_t i = coded[c];
    const auto& probe = static_cast<const ProbeKVCache&>(*probes[i]);
    if (probe.size() == 0) {
      throw InvalidArgument("kv_allocation: the first chunk reached no attention layer");
    }
    LayerDistortion e = measure_distortion(probe, int(i), plan[i].turboquant);
    for (auto [error, k] :
         {std::pair{&e.key_error, scale[2 * c]}, std::pair{&e.value_error, scale[2 * c + 1]}}) {
      const double at_ref = error->front();
      for (double& x : *error) x = at_ref > 0 ? k * x / at_ref : 0;
    }
    estimated.push_back(std::move(e));
  }
  const double budget = kv.budget_bits > 0 ? kv.budget_bits : plain_cost / weights;
  for (const LayerKVBits& bits : allocate_bits(estimated, budget)) {
    result.layer_bits.push_back(bits);
  }
  return result;
}

}  // namespace turbokv
