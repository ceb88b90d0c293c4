// DeviceRecurrentState (device_recurrent_state.h).
#include "model/cuda/device_recurrent_state.h"

#include "core/error.h"

namespace turbokv::cuda {

DeviceRecurrentState::DeviceRecurrentState(const RecurrentShape& shape) : shape_(shape) {
  if (shape.conv_channels < 1 || shape.conv_history < 0 || shape.heads < 1 || shape.k_dim < 1 ||
      shape.v_dim < 1) {
    throw InvalidArgument(str_cat("recurrent state shape: conv ", shape.conv_channels, " x ",
                                  shape.conv_history, ", heads ", shape.heads, " of ", shape.k_dim,
                                  " x ", shape.v_dim, " (all must be positive)"));
  }
  conv_ = DeviceBuffer<float>(size_t(shape.conv_history) * size_t(shape.conv_channels));
  state_ = DeviceBuffer<float>(size_t(shape.heads) * size_t(shape.k_dim) * size_t(shape.v_dim));
  conv_.zero();
  state_.zero();
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
