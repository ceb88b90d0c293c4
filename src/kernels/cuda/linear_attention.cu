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

// Tokens whose q, k, v, decays and betas a block stages in shared memory at a time, so the
// per-token loop reads no global memory (but the state, DK == 0) and writes only its outputs.
constexpr int kDeltaTile = 16;

size_t delta_smem_bytes(int dk, int threads) {
  return size_t(kDeltaTile) * size_t(2 * dk + 2 + threads) * sizeof(float);
}

// Grid (value heads, column tiles); thread j owns column j of the head's state [dk, dv]. DK > 0
// keeps the column in registers; DK == 0 works on the state in global memory (any dk).
template <int DK>
__global__ void delta_kernel(GatedDeltaRows in, GatedDeltaDims s, float* state, float* out) {
  extern __shared__ float sm[];
  const int dk = DK > 0 ? DK : s.k_dim, dv = s.v_dim;
  float* qk = sm;                         // [tile][2 dk]: each token's q, then k
  float* dec = qk + kDeltaTile * 2 * dk;  // [tile] exp(g)
  float* bet = dec + kDeltaTile;          // [tile] beta
  float* vs = bet + kDeltaTile;           // [tile][blockDim] this block's value columns
  const int h = blockIdx.x;
  const int j = blockIdx.y * blockDim.x + threadIdx.x;
  const int kh = h / (s.value_heads / s.key_heads);
  float* S = state + int64_t(h) * dk * dv;
  const bool active = j < dv;
  float col[DK > 0 ? DK : 1];
  if constexpr (DK > 0) {
#pragma unroll
    for (int i = 0; i < DK; ++i) col[i] = active ? S[int64_t(i) * dv + j] : 0.0f;
  }
  for (int64_t t0 = 0; t0 < in.T; t0 += kDeltaTile) {
    const int n = int(in.T - t0 < kDeltaTile ? in.T - t0 : kDeltaTile);
    __syncthreads();  // the previous tile is read
    for (int idx = threadIdx.x; idx < n * dk; idx += blockDim.x) {
      const int i = idx / dk, r = idx % dk;
      const int64_t at = (t0 + i) * in.qk_stride + int64_t(kh) * dk + r;
      qk[i * 2 * dk + r] = in.q[at];
      qk[i * 2 * dk + dk + r] = in.k[at];
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      dec[i] = expf(in.g[(t0 + i) * s.value_heads + h]);
      bet[i] = in.beta[(t0 + i) * s.value_heads + h];
    }
    for (int i = 0; i < n; ++i) {
      vs[i * blockDim.x + threadIdx.x] =
          active ? in.v[(t0 + i) * in.v_stride + int64_t(h) * dv + j] : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    for (int ti = 0; ti < n; ++ti) {
      const int64_t t = t0 + ti;
      const float decay = dec[ti], beta = bet[ti];
      const float* q = qk + ti * 2 * dk;
      const float* k = q + dk;
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
      kv = (vs[ti * blockDim.x + threadIdx.x] - kv) * beta;
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
  }
  if constexpr (DK > 0) {
    if (active) {
#pragma unroll
      for (int i = 0; i < DK; ++i) S[int64_t(i) * dv + j] = col[i];
    }
  }
}

// Shared memory of the chunked kernel (floats): K, Q, W [C][dk], U [C][dv], A [C][C], G, B, E [C].
size_t chunked_smem_bytes(int dk, int dv) {
  constexpr int C = kDeltaChunk;
  return size_t(3 * C * dk + C * dv + C * C + 3 * C) * sizeof(float);
}

__global__ void chunked_kernel(GatedDeltaRows in, GatedDeltaDims s, float* state, float* out) {
  constexpr int C = kDeltaChunk;
  extern __shared__ float sm[];
  const int dk = s.k_dim, dv = s.v_dim, Hv = s.value_heads;
  float* Ks = sm;             // [C][dk]
  float* Qs = Ks + C * dk;    // [C][dk]
  float* Ws = Qs + C * dk;    // [C][dk]: beta exp(G) k, then W
  float* Us = Ws + C * dk;    // [C][dv]: beta v, then U, then v_new
  float* A = Us + C * dv;     // [C][C]
  float* G = A + C * C;       // [C] cumulative log decay
  float* B = G + C;           // [C] beta
  float* E = B + C;           // [C] exp(G)
  const int h = blockIdx.x;
  const int kh = h / (Hv / s.key_heads);
  float* S = state + int64_t(h) * dk * dv;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t t0 = 0; t0 < in.T; t0 += C) {
    const int n = int(in.T - t0 < C ? in.T - t0 : C);
    if (tid == 0) {
      float acc = 0;
      for (int i = 0; i < n; ++i) {
        G[i] = acc += in.g[(t0 + i) * Hv + h];
        B[i] = in.beta[(t0 + i) * Hv + h];
        E[i] = expf(G[i]);
      }
    }
    __syncthreads();
    for (int idx = tid; idx < n * dk; idx += nt) {
      const int i = idx / dk, r = idx % dk;
      const int64_t at = (t0 + i) * in.qk_stride + int64_t(kh) * dk + r;
      const float k = in.k[at];
      Ks[i * dk + r] = k;
      Qs[i * dk + r] = in.q[at];
      Ws[i * dk + r] = k * B[i] * E[i];
    }
    for (int idx = tid; idx < n * dv; idx += nt) {
      const int i = idx / dv, c = idx % dv;
      Us[i * dv + c] = in.v[(t0 + i) * in.v_stride + int64_t(h) * dv + c] * B[i];
    }
    __syncthreads();
    // A[i][j] = beta_i <k_i, k_j> exp(G_i - G_j), j < i.
    for (int idx = tid; idx < n * n; idx += nt) {
      const int i = idx / n, j = idx % n;
      if (j >= i) continue;
      float d = 0;
      for (int r = 0; r < dk; ++r) d += Ks[i * dk + r] * Ks[j * dk + r];
      A[i * C + j] = B[i] * d * expf(G[i] - G[j]);
    }
    __syncthreads();
    // (I + A) U = beta v, (I + A) W = beta exp(G) k: forward substitution, a row at a time.
    for (int i = 1; i < n; ++i) {
      for (int c = tid; c < dv + dk; c += nt) {
        float* M = c < dv ? Us : Ws;
        const int w = c < dv ? dv : dk, col = c < dv ? c : c - dv;
        float x = M[i * w + col];
        for (int j = 0; j < i; ++j) x -= A[i * C + j] * M[j * w + col];
        M[i * w + col] = x;
      }
      __syncthreads();
    }
    // A[i][j] = <q_i, k_j> exp(G_i - G_j), j <= i (the intra-chunk attention).
    for (int idx = tid; idx < n * n; idx += nt) {
      const int i = idx / n, j = idx % n;
      if (j > i) continue;
      float d = 0;
      for (int r = 0; r < dk; ++r) d += Qs[i * dk + r] * Ks[j * dk + r];
      A[i * C + j] = d * expf(G[i] - G[j]);
    }
    __syncthreads();
    // Per state column: v_new = U - W S, the outputs, then the state update.
    const float glast = G[n - 1], decay = expf(glast);
    for (int c = tid; c < dv; c += nt) {
      float vn[C], o[C];
#pragma unroll
      for (int i = 0; i < C; ++i) {
        vn[i] = i < n ? Us[i * dv + c] : 0.0f;
        o[i] = 0;
      }
      for (int r = 0; r < dk; ++r) {
        const float sr = S[int64_t(r) * dv + c];
#pragma unroll
        for (int i = 0; i < C; ++i) {
          if (i < n) {
            vn[i] -= Ws[i * dk + r] * sr;
            o[i] += (Qs[i * dk + r] * E[i]) * sr;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < C; ++i) {
        if (i >= n) continue;
        float acc = o[i];
        for (int j = 0; j <= i; ++j) acc += A[i * C + j] * vn[j];
        out[((t0 + i) * Hv + h) * dv + c] = acc;
      }
      for (int r = 0; r < dk; ++r) {
        float acc = S[int64_t(r) * dv + c] * decay;
#pragma unroll
        for (int j = 0; j < C; ++j) {
          if (j < n) acc += (Ks[j * dk + r] * expf(glast - G[j])) * vn[j];
        }
        S[int64_t(r) * dv + c] = acc;
      }
    }
    __syncthreads();  // the chunk's shared rows are read; the next chunk overwrites them
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
  const size_t smem = delta_smem_bytes(s.k_dim, threads);
  if (smem > 48 * 1024) {
    TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(
        delta_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  switch (s.k_dim) {
    case 16: delta_kernel<16><<<grid, threads, smem, stream>>>(in, s, state, out); break;
    case 32: delta_kernel<32><<<grid, threads, smem, stream>>>(in, s, state, out); break;
    case 64: delta_kernel<64><<<grid, threads, smem, stream>>>(in, s, state, out); break;
    case 128: delta_kernel<128><<<grid, threads, smem, stream>>>(in, s, state, out); break;
    default: delta_kernel<0><<<grid, threads, smem, stream>>>(in, s, state, out); break;
  }
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void gated_delta_chunked(const GatedDeltaRows& in, const GatedDeltaDims& s, float* state,
                         float* out, cudaStream_t stream) {
  if (in.T <= 0) return;
  if (s.key_heads <= 0 || s.value_heads % s.key_heads != 0 || s.k_dim <= 0 || s.v_dim <= 0 ||
      s.k_dim > 256 || s.v_dim > 256) {
    throw InvalidArgument(str_cat("gated_delta_chunked: ", s.key_heads, " key heads of ", s.k_dim,
                                  ", ", s.value_heads, " value heads of ", s.v_dim,
                                  " (dims 1..256)"));
  }
  const size_t smem = chunked_smem_bytes(s.k_dim, s.v_dim);
  TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(
      chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  chunked_kernel<<<unsigned(s.value_heads), 128, smem, stream>>>(in, s, state, out);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void gated_rms_norm(float* x, const float* z, int64_t rows, int d, const float* w, float eps,
                    cudaStream_t stream) {
  if (rows <= 0) return;
  gated_norm_kernel<<<unsigned(rows), 128, 0, stream>>>(x, z, d, w, eps);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace turbokv::cuda
