// The fused TurboQuant attention kernel of keys 4 bits, values 3 bits (tq_attention.cuh).
#include "kernels/cuda/attention/tq_attention.cuh"

namespace turbokv::cuda::attn {

void launch_tq_attention_k4v3(const AttentionArgs& args, const TQKernelCodec& codec, int batch,
                              cudaStream_t stream) {
  tq::launch<4, 3, /*kPdl=*/true>(args, codec, batch, stream);
}

}  // namespace turbokv::cuda::attn
