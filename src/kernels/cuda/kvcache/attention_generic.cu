// Split pass of paged attention, runtime-generic kernels: uniform caches, and TurboQuant
// formats without a compile-time kernel (split codecs, other head_dims or bits).
#include "kernels/cuda/kvcache/attention_kernel.cuh"

namespace turbokv::cuda::paged {

void launch_uniform_attention(const AttnArgs& a, const UniformFormat& f, cudaStream_t stream) {
  launch_attention(a, UniformCodec{f}, stream);
}

void launch_tq_attention_generic(const AttnArgs& a, const TQFormat& f,
                                 const TQSequenceState* states, cudaStream_t stream) {
  launch_attention(a, TQGenericCodec{f, states}, stream);
}

}  // namespace turbokv::cuda::paged
