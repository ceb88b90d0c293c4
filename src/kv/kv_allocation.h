// TurboQuant bit allocation across layers and between keys and values, under a total budget,
// from a calibration-free statistic measured on the first chunk of the sequence itself.
//
// Statistic, per unit u = (global TurboQuant layer l, tensor X in {keys, values}) and candidate
// bit width b, an estimate of the KL divergence of the model's next-token distributions over the
// chunk when X of layer l alone is coded at b bits:
//   E_u(b) = K_u * D_u(b) / D_u(b_ref),   b_ref = the cheapest candidate (2 bits)
//  - D_u(b), the shape (measure_distortion): the distortion of layer l's attention output when X
//    goes through the request's TurboQuant cache (same seed, norm correction, centering and sink
//    tokens; b bits on X) and the other tensor stays exact, over every query row of the chunk:
//      D_u(b) = sum_rows |o_b - o|^2 / sum_rows |o|^2   (double sums)
//  - K_u, the scale: mean over the chunk's tokens of KL(dense || perturbed), the perturbed
//    forward having X of layer l (only) at b_ref through the same cache, every other TurboQuant
//    layer exact. (Attention-output distortion alone misjudges how much a layer and a tensor
//    matter to the logits; its shape over b follows the KL closely.)
// Cost: one dense forward of the chunk plus one forward per unit (2 per TurboQuant layer).
//
// Allocation (allocate_bits): each unit's candidates cost cost(b) = b + 16 * norms(b) / head_dim
// bits per element (norms(b) = 1, or 2 for k + 0.5 bits). Every unit starts at its cheapest
// candidate; then, while some move fits the budget, the unit and candidate with the largest
// (E(current) - E(candidate)) / (weight * (cost(candidate) - cost(current))) > 0 is taken (ties:
// the earlier unit - lower layer, keys before values - then the cheaper candidate). weight =
// kv_heads * head_dim (elements per token); the budget is bits per element averaged over the
// units with those weights. The result is one "L:K/V" override per layer.
#pragma once

#include <functional>
#include <vector>

#include "kv/dense_kv_cache.h"
#include "kv/turboquant_kv_cache.h"
#include "turbokv/kv_options.h"

namespace turbokv {

// The candidate bit widths of the allocation, ascending.
const std::vector<double>& allocation_candidates();

// Bits per element a TurboQuant tensor of `bits` stores (codes and fp16 norms).
double turboquant_cost_bits(double bits, int head_dim);

// A dense f32 cache that also keeps every query it attends with (the first chunk's q/k/v for
// the statistic). Attention is exact (attention_dense on its f32 rows).
class ProbeKVCache : public KVCache {
 public:
  ProbeKVCache(int kv_heads, int head_dim);

  std::string type_name() const override { return "probe"; }
  int kv_heads() const override { return dense_.kv_heads(); }
  int head_dim() const override { return dense_.head_dim(); }
  int64_t size() const override { return dense_.size(); }
  void append(const float* k, const float* v, int n_tokens) override;
  void trim(int64_t n) override;
  size_t nbytes() const override { return dense_.nbytes(); }
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  int64_t calibration_tokens() const override { return 0; }

  // Every attend() call: its queries and parameters (positions size() - n_q .. at the call).
  struct Call {
    std::vector<float> q;  // [n_q, n_heads, head_dim]
    int n_q = 0;
    int64_t first_pos = 0;
    AttentionParams params;
  };
  const std::vector<Call>& calls() const { return calls_; }
  const std::vector<int>& appends() const { return appends_; }  // tokens per append(), in order
  const DenseKVCache& dense() const { return dense_; }

 private:
  DenseKVCache dense_;
  std::vector<int> appends_;
  mutable std::vector<Call> calls_;
};

// One layer's D (or E) for the candidates, keys and values.
struct LayerDistortion {
  int layer = 0;
  int kv_heads = 0;
  int head_dim = 0;
  std::vector<double> bits;         // the candidates
  std::vector<double> key_error;    // keys at bits[i]
  std::vector<double> value_error;  // values at bits[i]
};

// The statistic of one probed layer under the levers of `base` (its bits are replaced by each
// candidate; the appends are replayed in the probe's pieces, so means and split orders come
// from the same first chunk).
LayerDistortion measure_distortion(const ProbeKVCache& probe, int layer,
                                   const TurboQuantKVConfig& base);

// Per-layer bits for the measured layers under budget_bits (see the top of this file). Throws
// InvalidArgument when the budget is below the cheapest candidate.
std::vector<LayerKVBits> allocate_bits(const std::vector<LayerDistortion>& layers,
                                       double budget_bits);

// Runs the chunk's tokens through each of caches (one sequence each, the same tokens) in one
// batched forward, writing all logits [n_tokens, vocab] of sequence i to logits[i].
using ChunkForward =
    std::function<void(const std::vector<LayerCaches*>& caches, const std::vector<float*>& logits)>;

// The whole step for a request with kv.allocation kAuto: measures on the first chunk (n_tokens
// tokens that forward runs, vocab logits per token) and returns kv with allocation kNone and the
// allocation appended to layer_bits (layers the plain setting keeps dense stay dense). Any other
// kv is returned as it is, without a forward. The budget is kv.budget_bits, else the mean cost
// of the plain setting's TurboQuant layers (keys floor, values ceil).
ResolvedKV allocate_kv(const std::vector<LayerSpec>& layers, const ResolvedKV& kv, int n_tokens,
                       int vocab, const ChunkForward& forward);

}  // namespace turbokv
