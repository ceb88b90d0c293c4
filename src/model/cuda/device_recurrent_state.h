// DeviceRecurrentState: a linear-attention layer's per-sequence state (kv/recurrent_state.h's
// RecurrentState) held in GPU memory: the short-convolution history [conv_history,
// conv_channels] and one [k_dim, v_dim] fp32 matrix per value head, zero at the start. Like the
// CPU state it holds no token rows: it cannot be trimmed, saved to a cache file or shared
// through the prefix cache (those throw Unsupported naming why). Its memory is one block of the
// KV pool (kv/cuda/device_pool.h), so the states count against the same GPU budget as the
// caches; a state larger than a pool chunk has its own allocation.
#pragma once

#include "kernels/cuda/device_buffer.h"
#include "kv/cuda/device_caches.h"
#include "kv/kv_cache.h"

namespace turbokv::cuda {

class DeviceRecurrentState final : public KVCache {
 public:
  // Throws InvalidArgument for a non-positive size, PoolExhausted when the pool is full.
  DeviceRecurrentState(const RecurrentShape& shape, DeviceCacheContext& context);
  ~DeviceRecurrentState() override;
  DeviceRecurrentState(const DeviceRecurrentState&) = delete;
  DeviceRecurrentState& operator=(const DeviceRecurrentState&) = delete;

  // The bytes of the pool block one state of this shape takes (0: larger than a pool chunk, so
  // it is allocated apart from the pool), for admission.
  static size_t pool_block_bytes(const RecurrentShape& shape);

  std::string type_name() const override { return "recurrent"; }
  int kv_heads() const override { return 0; }
  int head_dim() const override { return 0; }
  int64_t size() const override { return tokens_; }
  void append(const float* k, const float* v, int n_tokens) override;
  void trim(int64_t n) override;
  size_t nbytes() const override { return 0; }
  size_t state_bytes() const override { return (conv_floats_ + state_floats_) * sizeof(float); }
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  int64_t calibration_tokens() const override { return 0; }

  const RecurrentShape& shape() const { return shape_; }
  float* conv() { return conv_; }    // device [conv_history, conv_channels]
  float* state() { return state_; }  // device [heads, k_dim, v_dim]
  void advance(int64_t n) { tokens_ += n; }

 private:
  RecurrentShape shape_;
  DeviceCacheContext& context_;
  int64_t tokens_ = 0;
  size_t conv_floats_ = 0, state_floats_ = 0;
  size_t block_bytes_ = 0;  // > 0: the memory is a pool block of this size
  uint8_t* block_ = nullptr;
  DeviceBuffer<uint8_t> own_;  // otherwise
  float* conv_ = nullptr;
  float* state_ = nullptr;
};

}  // namespace turbokv::cuda
