// Latent attention (latent_attention.h): one block per (head, query); the scores go through the
// workspace (a row of len floats per block), then the softmax weights, then the weighted sum with
// a thread per output dim.
#include "kernels/cuda/latent_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const void* p, Elem e, int64_t i) {
  switch (e) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case Elem::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
  return 0;
}

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = is_max ? -FLT_MAX : 0.0f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) {
    total = is_max ? fmaxf(total, partial[w]) : total + partial[w];
  }
  return total;
}

__global__ void latent_kernel(const void* rows, Elem elem, int64_t len, int dim, const float* q,
                              int n_q, int heads, float scale, float* workspace, float* out) {
  extern __shared__ float qs[];  // [dim]
  const int h = blockIdx.x, i = blockIdx.y;
  const float* qr = q + (int64_t(i) * heads + h) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) qs[d] = qr[d];
  __syncthreads();
  const int64_t visible = len - n_q + i + 1;
  float* p = workspace + (int64_t(i) * heads + h) * len;
  float m = -FLT_MAX;
  for (int64_t s = threadIdx.x; s < visible; s += blockDim.x) {
    float acc = 0;
    for (int d = 0; d < dim; ++d) acc += qs[d] * load(rows, elem, s * dim + d);
    acc *= scale;
    p[s] = acc;
    m = fmaxf(m, acc);
  }
  m = block_reduce(m, true);
  float sum = 0;
  for (int64_t s = threadIdx.x; s < visible; s += blockDim.x) {
    const float e = expf(p[s] - m);
    p[s] = e;
    sum += e;
  }
  sum = block_reduce(sum, false);  // its barriers also publish p to the whole block
  const float inv = 1.0f / sum;
  float* o = out + (int64_t(i) * heads + h) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0;
    for (int64_t s = 0; s < visible; ++s) acc += p[s] * load(rows, elem, s * dim + d);
    o[d] = acc * inv;
  }
}

}  // namespace

int64_t latent_attention_workspace_floats(int n_q, int heads, int64_t len) {
  return int64_t(n_q) * heads * len;
}

void latent_attention(const void* rows, Elem elem, int64_t len, int dim, const float* q, int n_q,
                      int heads, float scale, float* workspace, float* out, cudaStream_t stream) {
  if (n_q <= 0) return;
  if (len < n_q || dim <= 0 || heads <= 0) {
    throw InvalidArgument(str_cat("latent_attention: ", n_q, " queries over ", len, " rows of ",
                                  dim, " dims, ", heads, " heads"));
  }
  const dim3 grid{unsigned(heads), unsigned(n_q)};
  latent_kernel<<<grid, kThreads, size_t(dim) * sizeof(float), stream>>>(
      rows, elem, len, dim, q, n_q, heads, scale, workspace, out);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace turbokv::cuda
