// Measurements behind `turbokv codec`: distortion and inner-product statistics of a codec on
// random unit vectors, and attention fidelity of K/V codecs on real q/k/v tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "turbokv/kv_options.h"

namespace turbokv::eval {

struct CodecStats {
  double bits = 0;
  std::string mode;  // "mse" | "prod"
  // E‖u - û‖² over random unit vectors. mse mode: the plain MSE codec (no norm correction,
  // the quantity of docs/design.md, "TurboQuant"); prod mode: the unbiased reconstruction.
  double mse = 0;
  double mse_norm_corrected = 0;  // mse mode only: the same with norm correction on
  // With random N(0, I) queries q: err = est(<q, x>) - <q, x>.
  double ip_bias = 0;         // Σ err·<q,x> / Σ <q,x>²: relative (multiplicative) bias
  double ip_var_times_d = 0;  // d · mean(err² / ‖q‖²)
};

// Throws InvalidArgument unless mode is "mse" with TurboQuant bits (multiple of 0.5 in [1, 8])
// or "prod" with integer bits 1..8.
void check_codec_mode_bits(const std::string& mode, double bits);

// mode "mse" (bits: multiple of 0.5 in [1, 8]; .5 = split codec, natural channel order) or
// "prod" (bits integer 1..8). samples unit vectors, queries_per_vector queries each.
// Throws InvalidArgument for a bad mode, bits, dim or samples.
CodecStats measure_codec(int dim, double bits, const std::string& mode, int64_t samples,
                         int queries_per_vector, uint64_t seed);

struct LayerFidelity {
  int layer = 0;
  double attn_cosine = 0;  // mean over query rows and heads of cos(out_quant, out_exact)
  double attn_rel_l2 = 0;  // mean over query rows and heads of ‖out_quant - out_exact‖/‖out_exact‖
};

// One layer: q [n_heads, T, d], k/v [kv_heads, T, d] (post-RoPE, fp32), causal softmax
// attention with scale 1/sqrt(d), exact vs K/V through the codecs of kv (TurboQuant or uniform;
// every layer quantized). Attention on the quantized side runs on codes (rotate_query, score,
// accumulate, unrotate). Split codecs pick channels by mean |x| over the first
// split_calibration_tokens tokens of each head's tensor.
LayerFidelity attention_fidelity(const float* q, const float* k, const float* v, int n_heads,
                                 int kv_heads, int tokens, int dim, const ResolvedKV& kv,
                                 int split_calibration_tokens = 256);

}  // namespace turbokv::eval
