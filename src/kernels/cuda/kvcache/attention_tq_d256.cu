// Split pass of paged attention: the compile-time TurboQuant kernels of head_dim 256.
#include "kernels/cuda/kvcache/attention_fixed.cuh"

namespace turbokv::cuda::paged {

bool launch_tq_attention_d256(const AttnArgs& a, const TQFormat& f, const TQSequenceState* states,
                              cudaStream_t stream) {
  return launch_fixed<256>(a, f, states, stream);
}

}  // namespace turbokv::cuda::paged
