// Dispatch to the compile-time TurboQuant kernels of one head_dim: single-segment codecs with
// key and value bits in {2, 3, 4}, nine instantiations per attention_tq_d*.cu file.
#pragma once

#include "kernels/cuda/kvcache/attention_kernel.cuh"

namespace turbokv::cuda::paged {

template <int kDim, int kKeyBits>
bool launch_fixed_value_bits(const AttnArgs& a, const TQFormat& f, const TQSequenceState* states,
                             cudaStream_t stream) {
  switch (f.value.seg[0].bits) {
    case 2:
      launch_attention(a, TQFixedCodec<kDim, kKeyBits, 2>{f, states}, stream);
      return true;
    case 3:
      launch_attention(a, TQFixedCodec<kDim, kKeyBits, 3>{f, states}, stream);
      return true;
    case 4:
      launch_attention(a, TQFixedCodec<kDim, kKeyBits, 4>{f, states}, stream);
      return true;
  }
  return false;
}

// False when the format has no compile-time kernel (the caller takes the generic one).
template <int kDim>
bool launch_fixed(const AttnArgs& a, const TQFormat& f, const TQSequenceState* states,
                  cudaStream_t stream) {
  if (f.head_dim != kDim || f.key.segments != 1 || f.value.segments != 1) return false;
  switch (f.key.seg[0].bits) {
    case 2:
      return launch_fixed_value_bits<kDim, 2>(a, f, states, stream);
    case 3:
      return launch_fixed_value_bits<kDim, 3>(a, f, states, stream);
    case 4:
      return launch_fixed_value_bits<kDim, 4>(a, f, states, stream);
  }
  return false;
}

}  // namespace turbokv::cuda::paged
