// DeviceRecurrentState (device_recurrent_state.h).
#include "model/cuda/device_recurrent_state.h"

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {
namespace {

size_t align16(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}

// The conv history, then the state, each 16-B aligned.
size_t conv_section_bytes(const RecurrentShape& s) {
  return align16(size_t(s.conv_history) * size_t(s.conv_channels) * sizeof(float));
}
size_t total_bytes(const RecurrentShape& s) {
  return conv_section_bytes(s) +
         align16(size_t(s.heads) * size_t(s.k_dim) * size_t(s.v_dim) * sizeof(float));
}

}  // namespace

size_t DeviceRecurrentState::pool_block_bytes(const RecurrentShape& shape) {
  const size_t bytes = total_bytes(shape);
  return bytes <= DeviceBlockPool::kChunkBytes ? bytes : 0;
}

DeviceRecurrentState::DeviceRecurrentState(const RecurrentShape& shape, DeviceCacheContext& context)
    : shape_(shape), context_(context) {
  if (shape.conv_channels < 1 || shape.conv_history < 0 || shape.heads < 1 || shape.k_dim < 1 ||
      shape.v_dim < 1) {
    throw InvalidArgument(str_cat("recurrent state shape: conv ", shape.conv_channels, " x ",
                                  shape.conv_history, ", heads ", shape.heads, " of ", shape.k_dim,
                                  " x ", shape.v_dim, " (all must be positive)"));
  }
  conv_floats_ = size_t(shape.conv_history) * size_t(shape.conv_channels);
  state_floats_ = size_t(shape.heads) * size_t(shape.k_dim) * size_t(shape.v_dim);
  const size_t conv_bytes = conv_section_bytes(shape);
  const size_t bytes = total_bytes(shape);
  uint8_t* base = nullptr;
  if (pool_block_bytes(shape) != 0) {
    base = block_ = context.pool().allocate(bytes);
    block_bytes_ = bytes;
  } else {
    own_ = DeviceBuffer<uint8_t>(bytes);
    base = own_.data();
  }
  conv_ = reinterpret_cast<float*>(base);
  state_ = reinterpret_cast<float*>(base + conv_bytes);
  // A fresh sequence starts from zero (pool blocks come uninitialized).
  TURBOKV_CUDA_CHECK(cudaMemsetAsync(base, 0, bytes, context.stream()));
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context.stream()));
}

DeviceRecurrentState::~DeviceRecurrentState() {
  if (block_ != nullptr) context_.pool().release(block_, block_bytes_);
}

void DeviceRecurrentState::append(const float*, const float*, int) {
  throw Unsupported("a recurrent state holds no K/V rows; linear-attention layers update it");
}

void DeviceRecurrentState::trim(int64_t n) {
  if (n == 0) return;
  throw Unsupported(str_cat("cannot drop ", n,
                            " tokens from a linear-attention recurrent state on the GPU: it keeps "
                            "no per-token history (re-run the prompt instead)"));
}

void DeviceRecurrentState::attend(const float*, int, const AttentionParams&, float*) const {
  throw Unsupported("a recurrent state cannot be attended to; it is read by linear attention");
}

}  // namespace turbokv::cuda
