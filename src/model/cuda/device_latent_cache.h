// Caches in contiguous GPU buffers for rows wider than the paged formats (kv/cuda) take.
//
// DeviceLatentCache: an MLA layer's latent rows [c | k_rope] in one contiguous GPU buffer of
// dense elements, for rows wider than the paged formats take (deepseek's 512 + 64): stored once
// (the row is both key and value), attended by kernels/cuda/latent_attention.h. Never quantized,
// like the CPU's latent cache; it cannot be saved to a cache file or shared through the prefix
// cache (Unsupported).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/kvcache/paged.h"
#include "kernels/cuda/model_ops.h"
#include "kv/kv_cache.h"

namespace turbokv::cuda {

class DeviceLatentCache final : public KVCache {
 public:
  // Throws InvalidArgument for dim outside 1..4096.
  DeviceLatentCache(int dim, DenseElem elem, cudaStream_t stream);

  std::string type_name() const override;  // as the CPU's dense cache: "dense-f32", ...
  int kv_heads() const override { return 1; }
  int head_dim() const override { return dim_; }
  int64_t size() const override { return size_; }
  // Host rows; v must equal k (a latent row is its own value). Synchronizes.
  void append(const float* k, const float* v, int n_tokens) override;
  void trim(int64_t n) override;
  // Bytes of the rows held (each stored once).
  size_t nbytes() const override { return size_t(size_) * size_t(dim_) * elem_bytes(elem_); }
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  int64_t calibration_tokens() const override { return 0; }

  // Device rows [n, dim] fp32, queued on the stream.
  void append_device(const float* rows, int n);
  // Device queries [n_q, n_heads, dim] -> out [n_q, n_heads, dim], queued on the stream.
  void attend_device(const float* q, int n_q, int n_heads, float scale, float* out) const;

 private:
  int dim_;
  DenseElem dense_;
  Elem elem_;
  cudaStream_t stream_;
  int64_t size_ = 0;
  DeviceBuffer<uint8_t> rows_;  // [capacity, dim] of elem_
  mutable DeviceBuffer<float> workspace_;
};

// DeviceWideKVCache: dense keys and values [tokens, kv_heads, head_dim] in contiguous GPU buffers
// for attention layers whose heads are wider than the paged formats take (gemma4's 512-dim global
// heads), attended by kernels/cuda/latent_attention.h's contiguous_attention. Dense only (no GPU
// codec takes such heads); window > 0 masks keys outside a sliding window (all rows are kept).
// Like the latent cache it cannot be saved or prefix-shared (Unsupported).
class DeviceWideKVCache final : public KVCache {
 public:
  // Throws InvalidArgument for kv_heads outside 1..1024 or head_dim outside 1..4096.
  DeviceWideKVCache(int kv_heads, int head_dim, DenseElem elem, int window, cudaStream_t stream);

  std::string type_name() const override;  // as the CPU's: "dense-f16", ..., or "rotating"
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return dim_; }
  int64_t size() const override { return size_; }
  void append(const float* k, const float* v, int n_tokens) override;  // host rows; synchronizes
  void trim(int64_t n) override;
  // Bytes of the keys and values held (a rotating cache: those of the window).
  size_t nbytes() const override;
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  int64_t calibration_tokens() const override { return 0; }

  // Device rows [n, kv_heads, head_dim] fp32, queued on the stream.
  void append_device(const float* k, const float* v, int n);
  // Device queries [n_q, n_heads, head_dim] -> out, queued on the stream.
  void attend_device(const float* q, int n_q, int n_heads, float scale, float* out) const;

 private:
  int kv_heads_, dim_;
  DenseElem dense_;
  Elem elem_;
  int window_;
  cudaStream_t stream_;
  int64_t size_ = 0;
  DeviceBuffer<uint8_t> keys_, values_;  // [capacity, kv_heads, head_dim] of elem_
  mutable DeviceBuffer<float> workspace_;
};

}  // namespace turbokv::cuda
