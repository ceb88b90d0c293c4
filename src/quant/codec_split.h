// Split codec for k + 0.5 bits per element (docs/design.md, "TurboQuant"): a channel permutation
// puts the round(d/2) "high" channels first; they are coded by an MSE codec at k+1 bits, the other
// channels by an MSE codec at k bits, each with its own norm and rotation.
// Record layout: codes = [high codes | low codes], norms = [high norm, low norm].
// Rotated frame: [R_high q_high (high_dim) | R_low q_low (dim - high_dim)].
#pragma once

#include <vector>

#include "quant/codec_mse.h"

namespace turbokv::quant {

struct SplitCodecConfig {
  int dim = 0;
  int low_bits = 0;  // k: low half k bits, high half k+1 bits; 1..7
  uint64_t seed = 0;
  TensorRole role = TensorRole::kKey;
  bool norm_correction = true;
  bool unbiased_norm = false;
  std::vector<int> channel_order;  // [dim] permutation, high channels first; empty = natural
};

class SplitCodec final : public TurboQuantCodec {
 public:
  // Throws InvalidArgument for dim < 4, low_bits outside 1..7, or a bad channel_order.
  explicit SplitCodec(const SplitCodecConfig& config);

  int dim() const override { return dim_; }
  double bits() const override { return low_.int_bits() + 0.5; }
  size_t code_bytes() const override { return high_.code_bytes() + low_.code_bytes(); }
  int norms_per_vector() const override { return 2; }
  int high_dim() const { return high_.dim(); }
  const std::vector<int>& channel_order() const { return order_; }
  const MseCodec& high() const { return high_; }
  const MseCodec& low() const { return low_; }

  void quantize(const float* x, uint8_t* codes, uint16_t* norms,
                Isa isa = best_isa()) const override;
  void dequantize(const uint8_t* codes, const uint16_t* norms, float* x) const override;
  void rotate_query(const float* q, float* rq, Isa isa = best_isa()) const override;
  void score_multi(const float* rq, int n_queries, const uint8_t* codes, const uint16_t* norms,
                   int64_t n, float* scores, Isa isa = best_isa()) const override;
  void accumulate_multi(const float* weights, int n_queries, const uint8_t* codes,
                        const uint16_t* norms, int64_t n, float* acc,
                        Isa isa = best_isa()) const override;
  void unrotate(const float* acc, float* out, Isa isa = best_isa()) const override;

 private:
  int dim_;
  std::vector<int> order_;  // [dim]
  MseCodec high_, low_;
};

// Channels ranked by mean |x| over x [n, dim] (descending; ties by index): the order to give
// SplitCodecConfig::channel_order. Throws InvalidArgument for n < 1 or dim < 1.
std::vector<int> choose_split_channels(const float* x, int64_t n, int dim);

}  // namespace turbokv::quant
