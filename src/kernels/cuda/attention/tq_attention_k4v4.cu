// The fused TurboQuant attention kernel of keys 4 bits, values 4 bits (tq_attention.cuh).
#include "kernels/cuda/attention/tq_attention.cuh"

namespace turbokv::cuda::attn {

void launch_tq_attention_k4v4(const AttentionArgs& args, const TQKernelCodec& codec, int batch,
                              cudaStream_t stream) {
  tq::launch<4, 4, /*kPdl=*/false>(args, codec, batch, stream);
}

}  // namespace turbokv::cuda::attn
