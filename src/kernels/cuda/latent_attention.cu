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

// k, v rows [len, kv_heads, dim]; query head h reads KV head h / (heads / kv_heads).
__global__ void contiguous_kernel(const void* k, const void* v, Elem elem, int64_t len,
                                  int kv_heads, int dim, const float* q, int n_q, int heads,
                                  float scale, int window, float* workspace, float* out) {
  extern __shared__ float qs[];  // [dim]
  const int h = blockIdx.x, i = blockIdx.y;
  const int64_t kv = h / (heads / kv_heads), stride = int64_t(kv_heads) * dim;
  const float* qr = q + (int64_t(i) * heads + h) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) qs[d] = qr[d];
  __syncthreads();
  const int64_t pos = len - n_q + i, end = pos + 1;
  const int64_t begin = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
  float* p = workspace + (int64_t(i) * heads + h) * len;
  float m = -FLT_MAX;
  for (int64_t s = begin + threadIdx.x; s < end; s += blockDim.x) {
    float acc = 0;
    for (int d = 0; d < dim; ++d) acc += qs[d] * load(k, elem, s * stride + kv * dim + d);
    acc *= scale;
    p[s] = acc;
    m = fmaxf(m, acc);
  }
  m = block_reduce(m, true);
  float sum = 0;
  for (int64_t s = begin + threadIdx.x; s < end; s += blockDim.x) {
    const float e = expf(p[s] - m);
    p[s] = e;
    sum += e;
  }
  sum = block_reduce(sum, false);  // its barriers also publish p to the whole block
  const float inv = 1.0f / sum;
  float* o = out + (int64_t(i) * heads + h) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0;
    for (int64_t s = begin; s < end; ++s) acc += p[s] * load(v, elem, s * stride + kv * dim + d);
    o[d] = acc * inv;
  }
}

}  // namespace

int64_t latent_attention_workspace_floats(int n_q, int heads, int64_t len) {
  return int64_t(n_q) * heads * len;
}

void contiguous_attention(const void* k, const void* v, Elem elem, int64_t len, int kv_heads,
                          int dim, const float* q, int n_q, int heads, float scale, int window,
                          float* workspace, float* out, cudaStream_t stream) {
  if (n_q <= 0) return;
  if (len < n_q || dim <= 0 || kv_heads <= 0 || heads <= 0 || heads % kv_heads != 0 ||
      window < 0) {
    throw InvalidArgument(str_cat("contiguous_attention: ", n_q, " queries over ", len,
                                  " rows of ", kv_heads, " KV heads of ", dim, " dims, ", heads,
                                  " heads, window ", window));
  }
  const dim3 grid{unsigned(heads), unsigned(n_q)};
  contiguous_kernel<<<grid, kThreads, size_t(dim) * sizeof(float), stream>>>(
      k, v, elem, len, kv_heads, dim, q, n_q, heads, scale, window, workspace, out);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void latent_attention(const void* rows, Elem elem, int64_t len, int dim, const float* q, int n_q,
                      int heads, float scale, float* workspace, float* out, cudaStream_t stream) {
  contiguous_attention(rows, rows, elem, len, 1, dim, q, n_q, heads, scale, 0, workspace, out,
                       stream);
}

}  // namespace turbokv::cuda
