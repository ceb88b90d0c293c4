// Gated DeltaNet kernels (linear_attention.h). fp32 throughout, in the CPU steps' order of
// operations (model/linear_attention.cc) but for the delta rule's dot products, which sum in four
// parts; the two agree to rounding.
#include "kernels/cuda/linear_attention.h"

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {
namespace {

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total += partial[w];
  return total;
}

// One thread per channel, the tokens in order; the history is rewritten in place oldest first
// (entry r reads entry r + T, not yet overwritten).
__global__ void conv_kernel(const float* x, int64_t T, int C, int K, const float* weight,
                            float* history, float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int H = K - 1;
  const float* w = weight + int64_t(c) * K;
  for (int64_t t = 0; t < T; ++t) {
    float acc = 0;
    for (int j = 0; j < K; ++j) {
      const int64_t u = t - H + j;
      const float in = u >= 0 ? x[u * C + c] : history[(H + u) * C + c];
      acc += w[j] * in;
    }
    out[t * C + c] = silu(acc);
  }
  for (int r = 0; r < H; ++r) {
    const int64_t u = T - H + r;
    history[int64_t(r) * C + c] = u >= 0 ? x[u * C + c] : history[(H + u) * C + c];
  }
}

// One block per token: a warp per q or k head (L2 norm), then a thread per value head.
__global__ void prepare_kernel(float* qkv, float* a, float* b, GatedDeltaDims s,
                               const float* a_log, const float* dt_bias) {
  const int64_t t = blockIdx.x;
  const int64_t key_dim = int64_t(s.key_heads) * s.k_dim;
  const int64_t width = 2 * key_dim + int64_t(s.value_heads) * s.v_dim;
  float* row = qkv + t * width;
  const float q_scale = 1.0f / sqrtf(float(s.k_dim));
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int hh = threadIdx.x / 32; hh < 2 * s.key_heads; hh += warps) {
    float* x = row + int64_t(hh) * s.k_dim;  // q heads, then k heads
    float d = 0;
    for (int i = lane; i < s.k_dim; i += 32) d += x[i] * x[i];
    d = warp_sum(d);
    const float inv = 1.0f / sqrtf(d + 1e-6f);
    for (int i = lane; i < s.k_dim; i += 32) {
      float v = x[i] * inv;
      if (hh < s.key_heads) v *= q_scale;
      x[i] = v;
    }
  }
  for (int h = threadIdx.x; h < s.value_heads; h += blockDim.x) {
    float& g = a[t * s.value_heads + h];
    g = -expf(a_log[h]) * softplus(g + dt_bias[h]);
    float& beta = b[t * s.value_heads + h];
    beta = 1.0f / (1.0f + expf(-beta));
  }
}

// Grid (value heads, column tiles); thread j owns column j of the head's state [dk, dv]. DK > 0
// keeps the column in registers; DK == 0 works on the state in global memory (any dk).
template <int DK>
__global__ void delta_kernel(GatedDeltaRows in, GatedDeltaDims s, float* state, float* out) {
  extern __shared__ float qk[];  // [2 * dk]: the token's q, then k
  const int h = blockIdx.x;
  const int j = blockIdx.y * blockDim.x + threadIdx.x;
  const int dk = DK > 0 ? DK : s.k_dim, dv = s.v_dim;
  const int kh = h / (s.value_heads / s.key_heads);
  float* S = state + int64_t(h) * dk * dv;
  const bool active = j < dv;
  float col[DK > 0 ? DK : 1];
  if constexpr (DK > 0) {
#pragma unroll
    for (int i = 0; i < DK; ++i) col[i] = active ? S[int64_t(i) * dv + j] : 0.0f;
  }
  for (int64_t t = 0; t < in.T; ++t) {
    __syncthreads();  // the previous token's q, k are read
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      qk[i] = in.q[t * in.qk_stride + int64_t(kh) * dk + i];
      qk[dk + i] = in.k[t * in.qk_stride + int64_t(kh) * dk + i];
    }
    __syncthreads();
    if (!active) continue;
    const float decay = expf(in.g[t * s.value_heads + h]);
    const float beta = in.beta[t * s.value_heads + h];
    const float* q = qk;
    const float* k = qk + dk;
    float kv = 0;
    if constexpr (DK > 0) {
      // Four partial sums: a dependency chain of DK / 4 multiply-adds instead of DK.
      float part[4] = {0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < DK; ++i) {
        col[i] *= decay;
        part[i % 4] += col[i] * k[i];
      }
      kv = (part[0] + part[1]) + (part[2] + part[3]);
    } else {
      for (int i = 0; i < dk; ++i) {
        const float v = S[int64_t(i) * dv + j] * decay;
        S[int64_t(i) * dv + j] = v;
        kv += v * k[i];
      }
    }
    kv = (in.v[t * in.v_stride + int64_t(h) * dv + j] - kv) * beta;
    float o = 0;
    if constexpr (DK > 0) {
      float part[4] = {0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < DK; ++i) {
        col[i] += k[i] * kv;
        part[i % 4] += col[i] * q[i];
      }
      o = (part[0] + part[1]) + (part[2] + part[3]);
    } else {
      for (int i = 0; i < dk; ++i) {
        const float v = S[int64_t(i) * dv + j] + k[i] * kv;
        S[int64_t(i) * dv + j] = v;
        o += v * q[i];
      }
    }
    out[(t * s.value_heads + h) * dv + j] = o;
  }
  if constexpr (DK > 0) {
    if (active) {
#pragma unroll
      for (int i = 0; i < DK; ++i) S[int64_t(i) * dv + j] = col[i];
    }
  }
}

__global__ void gated_norm_kernel(float* x, const float* z, int d, const float* w, float eps) {
  const int64_t r = blockIdx.x;
  float* xr = x + r * d;
  const float* zr = z + r * d;
  float ss = 0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) xr[i] = w[i] * (xr[i] * inv) * silu(zr[i]);
}

}  // namespace

void causal_conv1d_silu(const float* x, int64_t T, int C, int K, const float* weight,
                        float* history, float* out, cudaStream_t stream) {
  if (T <= 0) return;
  if (K < 1) throw InvalidArgument(str_cat("causal_conv1d_silu: kernel size ", K));
  conv_kernel<<<unsigned((C + 127) / 128), 128, 0, stream>>>(x, T, C, K, weight, history, out);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void gated_delta_prepare(float* qkv, float* a, float* b, int64_t T, const GatedDeltaDims& s,
                         const float* a_log, const float* dt_bias, cudaStream_t stream) {
  if (T <= 0) return;
  prepare_kernel<<<unsigned(T), 256, 0, stream>>>(qkv, a, b, s, a_log, dt_bias);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void gated_delta_recurrent(const GatedDeltaRows& in, const GatedDeltaDims& s, float* state,
                           float* out, cudaStream_t stream) {
  if (in.T <= 0) return;
  if (s.key_heads <= 0 || s.value_heads % s.key_heads != 0 || s.k_dim <= 0 || s.v_dim <= 0) {
    throw InvalidArgument(str_cat("gated_delta_recurrent: ", s.key_heads, " key heads of ",
                                  s.k_dim, ", ", s.value_heads, " value heads of ", s.v_dim));
  }
  // One warp per block and tile of 32 columns: the heads x tiles blocks spread over the SMs (a
  // head's columns are independent), and the per-token barrier is a warp's.
  const int threads = 32;
  const dim3 grid(unsigned(s.value_heads), unsigned((s.v_dim + threads - 1) / threads));
  const size_t smem = size_t(2) * s.k_dim * sizeof(float);
  switch (s.k_dim) {
    case 16: delta_kernel<16><<<grid, threads, smem, stream>>>(in, s, state, out); break;
    case 32: delta_kernel<32><<<grid, threads, smem, stream>>>(in, s, state, out); break;
    case 64: delta_kernel<64><<<grid, threads, smem, stream>>>(in, s, state, out); break;
    case 128: delta_kernel<128><<<grid, threads, smem, stream>>>(in, s, state, out); break;
    default: delta_kernel<0><<<grid, threads, smem, stream>>>(in, s, state, out); break;
  }
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void gated_rms_norm(float* x, const float* z, int64_t rows, int d, const float* w, float eps,
                    cudaStream_t stream) {
  if (rows <= 0) return;
  gated_norm_kernel<<<unsigned(rows), 128, 0, stream>>>(x, z, d, w, eps);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace turbokv::cuda
