// The fused TurboQuant attention kernel of keys 2 bits, values 3 bits (tq_attention.cuh).
#include "kernels/cuda/attention/tq_attention.cuh"

namespace turbokv::cuda::attn {

void launch_tq_attention_k2v3(const AttentionArgs& args, const TQKernelCodec& codec, int batch,
                              cudaStream_t stream) {
  tq::launch<2, 3, /*kPdl=*/false>(args, codec, batch, stream);
}

}  // namespace turbokv::cuda::attn
