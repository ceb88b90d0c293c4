// Split pass of paged attention for dense caches: one runtime-generic kernel per element type.
#include "kernels/cuda/kvcache/attention_kernel.cuh"

namespace turbokv::cuda::paged {

void launch_dense_attention(const AttnArgs& a, const DenseFormat& f, cudaStream_t stream) {
  switch (f.elem) {
    case DenseElem::kF32:
      launch_attention(a, DenseCodec<float>{f.head_dim}, stream);
      return;
    case DenseElem::kF16:
      launch_attention(a, DenseCodec<__half>{f.head_dim}, stream);
      return;
    case DenseElem::kBF16:
      launch_attention(a, DenseCodec<__nv_bfloat16>{f.head_dim}, stream);
      return;
  }
}

}  // namespace turbokv::cuda::paged
