// The value means of centered caches added to attention rows computed on the centered codes
// (the fused kernels' output layout): out = Σ p (v − μ_v) + μ_v, since Σ p = 1.
#include <cuda_fp16.h>

#include "core/error.h"
#include "kernels/cuda/kvcache/launch.cuh"
#include "kernels/cuda/kvcache/paged.h"

namespace turbokv::cuda {
namespace {

constexpr int kThreads = 128;

// One block per (row, sequence): row = query * n_heads + head.
__global__ void __launch_bounds__(kThreads)
    add_value_means_kernel(const TQSequenceState* states, int n_q, int n_heads, int group,
                           int head_dim, float* out) {
  const int b = blockIdx.y, row = blockIdx.x, head = row % n_heads;
  const __half* mean = states[b].value_mean;
  if (mean == nullptr) return;
  mean += size_t(head / group) * head_dim;
  float* o = out + (size_t(b) * n_q * n_heads + row) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += kThreads) o[d] += __half2float(mean[d]);
}

}  // namespace

void add_value_means(const TQSequenceState* states, int batch, int n_q, int n_heads, int kv_heads,
                     int head_dim, float* out, cudaStream_t stream) {
  if (batch < 1 || batch > 65535 || n_q < 0 || kv_heads < 1 || n_heads % kv_heads != 0 ||
      head_dim < 1 || states == nullptr || out == nullptr) {
    throw InvalidArgument(str_cat("add_value_means: batch ", batch, ", n_q ", n_q, ", n_heads ",
                                  n_heads, ", kv_heads ", kv_heads, ", head_dim ", head_dim));
  }
  if (n_q == 0) return;
  paged::launch_kernel(add_value_means_kernel,
                       dim3(unsigned(n_q) * unsigned(n_heads), unsigned(batch)), dim3(kThreads), 0,
                       stream, states, n_q, n_heads, n_heads / kv_heads, head_dim, out);
}

}  // namespace turbokv::cuda
