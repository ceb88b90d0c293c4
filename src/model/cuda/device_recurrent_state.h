// DeviceRecurrentState: a linear-attention layer's per-sequence state (kv/recurrent_state.h's
// RecurrentState) held in GPU memory: the short-convolution history [conv_history,
// conv_channels] and one [k_dim, v_dim] fp32 matrix per value head, zero at the start. Like the
// CPU state it holds no token rows: it cannot be trimmed, saved to a cache file or shared
// through the prefix cache (those throw Unsupported naming why).
#pragma once

#include "kernels/cuda/device_buffer.h"
#include "kv/kv_cache.h"

namespace turbokv::cuda {

class DeviceRecurrentState final : public KVCache {
 public:
  // Throws InvalidArgument for a non-positive size.
  explicit DeviceRecurrentState(const RecurrentShape& shape);

  std::string type_name() const override { return "recurrent"; }
  int kv_heads() const override { return 0; }
  int head_dim() const override { return 0; }
  int64_t size() const override { return tokens_; }
  void append(const float* k, const float* v, int n_tokens) override;
  void trim(int64_t n) override;
  size_t nbytes() const override { return 0; }
  size_t state_bytes() const override { return conv_.bytes() + state_.bytes(); }
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  int64_t calibration_tokens() const override { return 0; }

  const RecurrentShape& shape() const { return shape_; }
  float* conv() { return conv_.data(); }    // device [conv_history, conv_channels]
  float* state() { return state_.data(); }  // device [heads, k_dim, v_dim]
  void advance(int64_t n) { tokens_ += n; }

 private:
  RecurrentShape shape_;
  int64_t tokens_ = 0;
  DeviceBuffer<float> conv_, state_;
};

}  // namespace turbokv::cuda
