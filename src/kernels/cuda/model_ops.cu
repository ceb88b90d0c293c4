// Model kernels (model_ops.h). Plain shapes: one block per row where a row needs a reduction
// (RMSNorm sums in double as the CPU reference does), grid-stride loops elsewhere. They are a
// small part of a step; the GEMMs and attention dominate. The kernels of a decode step launch
// with PDL (launch.h): each starts with pdl_wait() and, being small, releases its successor at
// once.
#include "kernels/cuda/model_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <initializer_list>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rope.cuh"

namespace turbokv::cuda {

size_t elem_bytes(Elem e) { return e == Elem::kF32 ? 4 : 2; }

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

__device__ __forceinline__ float load_elem(const void* p, Elem e, int64_t i) {
  switch (e) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case Elem::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
  return 0;
}

__device__ __forceinline__ void store_elem(void* p, Elem e, int64_t i, float x) {
  switch (e) {
    case Elem::kF32: static_cast<float*>(p)[i] = x; break;
    case Elem::kF16: static_cast<__half*>(p)[i] = __float2half_rn(x); break;
    case Elem::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); break;
  }
}

// Row kernels of rows that fit the vector path (dim % 4 == 0, dim <= kRowThreads * 4 *
// kRowVecs, 16-B aligned rows): one block of kRowThreads per row, each thread holding its
// float4s in registers between the sum and the scaling, so a row costs one round trip to memory
// (a decode step's rows are single rows: latency, not bandwidth, is their cost).
constexpr int kRowThreads = 1024;
constexpr int kRowVecs = 4;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool vector_rows(int64_t dim, std::initializer_list<const void*> pointers) {
  if (dim % 4 != 0 || dim > int64_t(kRowThreads) * 4 * kRowVecs) return false;
  for (const void* p : pointers) {
    if (p != nullptr && !aligned16(p)) return false;
  }
  return true;
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// Elements 4i .. 4i + 3 of out (narrowed like store_elem).
__device__ __forceinline__ void store4(void* p, Elem e, int64_t i, float4 v) {
  switch (e) {
    case Elem::kF32: static_cast<float4*>(p)[i] = v; break;
    case Elem::kF16: {
      const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
      uint2 u;
      memcpy(&u.x, &a, 4);
      memcpy(&u.y, &b, 4);
      static_cast<uint2*>(p)[i] = u;
      break;
    }
    case Elem::kBF16: {
      const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y);
      const __nv_bfloat162 b = __floats2bfloat162_rn(v.z, v.w);
      uint2 u;
      memcpy(&u.x, &a, 4);
      memcpy(&u.y, &b, 4);
      static_cast<uint2*>(p)[i] = u;
      break;
    }
  }
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total += partial[w];
  return total;
}

// Row blockIdx.y, columns split over blockIdx.x (one element per thread for a decode step).
__global__ void embed_kernel(const void* table, Elem elem, int64_t cols, const int32_t* ids,
                             float scale, float* out) {
  pdl_wait();
  pdl_release();
  const int64_t row = blockIdx.y;
  const int64_t src = int64_t(ids[row]) * cols;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < cols;
       c += int64_t(gridDim.x) * blockDim.x) {
    out[row * cols + c] = scale * load_elem(table, elem, src + c);
  }
}

__global__ void rms_norm_kernel(const float* x, int64_t dim, const float* w, float eps, void* out,
                                Elem out_elem) {
  pdl_wait();
  pdl_release();
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  double s = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += double(xr[i]) * xr[i];
  s = block_sum(s);
  const float inv = float(1.0 / sqrt(s / double(dim) + double(eps)));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    store_elem(out, out_elem, row * dim + i, (xr[i] * inv) * w[i]);
  }
}

// rms_norm_kernel on the vector path (the same double sum of the squares, in another order).
// residual: x += y + bias first (the new x is normed). y nullptr: plain RMSNorm.
__global__ void __launch_bounds__(kRowThreads)
    row_norm_vec_kernel(float* x, const float* y, const float* bias, int64_t dim, const float* w,
                        float eps, void* out, Elem out_elem) {
  pdl_wait();
  pdl_release();
  const int64_t row = blockIdx.x;
  const int64_t n4 = dim / 4;
  float4* xr = reinterpret_cast<float4*>(x + row * dim);
  const float4* yr = y != nullptr ? reinterpret_cast<const float4*>(y + row * dim) : nullptr;
  float4 v[kRowVecs];
  double s = 0;
#pragma unroll
  for (int j = 0; j < kRowVecs; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kRowThreads;
    if (i >= n4) break;
    v[j] = xr[i];
    if (yr != nullptr) {
      const float4 t = bias != nullptr ? add4(yr[i], reinterpret_cast<const float4*>(bias)[i])
                                       : yr[i];
      v[j] = add4(v[j], t);
      xr[i] = v[j];
    }
    s += double(v[j].x) * v[j].x;
    s += double(v[j].y) * v[j].y;
    s += double(v[j].z) * v[j].z;
    s += double(v[j].w) * v[j].w;
  }
  s = block_sum(s);
  const float inv = float(1.0 / sqrt(s / double(dim) + double(eps)));
#pragma unroll
  for (int j = 0; j < kRowVecs; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kRowThreads;
    if (i >= n4) break;
    const float4 wv = reinterpret_cast<const float4*>(w)[i];
    store4(out, out_elem, row * n4 + i,
           make_float4((v[j].x * inv) * wv.x, (v[j].y * inv) * wv.y, (v[j].z * inv) * wv.z,
                       (v[j].w * inv) * wv.w));
  }
}

// x[r, :] += y[r, :] + bias as float4s over the grid (residual_kernel without post norm).
__global__ void residual_vec_kernel(float4* x, const float4* y, int64_t n4, int64_t dim4,
                                    const float4* bias) {
  pdl_wait();
  pdl_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    x[i] = add4(x[i], bias != nullptr ? add4(y[i], bias[i % dim4]) : y[i]);
  }
}

// out[r, :] = x[rows[r], :] or scale * table[ids[r], :] as float4s (grid: row chunks, rows).
__global__ void gather_vec_kernel(const float* x, int64_t dim, const int32_t* rows, float* out) {
  pdl_wait();
  pdl_release();
  const int64_t r = blockIdx.y, i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= dim / 4) return;
  reinterpret_cast<float4*>(out + r * dim)[i] =
      reinterpret_cast<const float4*>(x + int64_t(rows[r]) * dim)[i];
}

// One block per (token, head slot): slots [0, heads) are q heads, then kv_heads k heads, then
// kv_heads v heads.
__global__ void qkv_post_kernel(const QkvPostProblem p) {
  const int64_t t = blockIdx.x;
  const int slot = blockIdx.y;
  // Before waiting for the previous kernel: the cos and sin of this thread's first rotated pair,
  // which depend on host data only (positions, inv_freq).
  const int half = p.rotary_dim / 2;
  const bool rotates = slot < p.heads + p.kv_heads && p.rotary_dim > 0;
  float c0 = 0, s0 = 0;
  if (rotates && int(threadIdx.x) < half) {
    rope_cos_sin(float(p.positions[t]), p.inv_freq[threadIdx.x], p.attention_scaling, &c0, &s0);
  }
  pdl_wait();
  pdl_release();
  extern __shared__ float h[];  // [head_dim]
  const int d = p.head_dim;
  const int q_dim = p.heads * d, kv_dim = p.kv_heads * d;
  int col, kind;  // kind 0 q, 1 k, 2 v
  float* dst;
  if (slot < p.heads) {
    kind = 0;
    col = slot * d;
    dst = p.q + (t * p.heads + slot) * d;
  } else if (slot < p.heads + p.kv_heads) {
    kind = 1;
    col = q_dim + (slot - p.heads) * d;
    dst = p.k + (t * p.kv_heads + (slot - p.heads)) * d;
  } else {
    kind = 2;
    col = q_dim + kv_dim + (slot - p.heads - p.kv_heads) * d;
    dst = p.v + (t * p.kv_heads + (slot - p.heads - p.kv_heads)) * d;
  }
  const float* src = p.qkv + t * (q_dim + 2 * kv_dim) + col;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    h[i] = __fadd_rn(src[i], p.bias != nullptr ? p.bias[col + i] : 0.0f);
  }
  __syncthreads();
  const float* norm = kind == 0 ? p.q_norm : kind == 1 ? p.k_norm : nullptr;
  if (norm != nullptr) {
    double s = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += double(h[i]) * h[i];
    s = block_sum(s);
    const float inv = float(1.0 / sqrt(s / double(d) + double(p.norm_eps)));
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) h[i] = (h[i] * inv) * norm[i];
    __syncthreads();
  }
  if (rotates) {
    const float pos = float(p.positions[t]);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      float c = c0, sn = s0;
      if (i != int(threadIdx.x)) rope_cos_sin(pos, p.inv_freq[i], p.attention_scaling, &c, &sn);
      rope_rotate(h[i], h[i + half], c, sn, &dst[i], &dst[i + half]);
    }
    for (int i = p.rotary_dim + threadIdx.x; i < d; i += blockDim.x) dst[i] = h[i];
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = h[i];
  }
}

__global__ void gated_kernel(const float* gate_up, int64_t rows, int64_t inter,
                             const float* gate_bias, const float* up_bias, Activation act,
                             void* out, Elem out_elem) {
  pdl_wait();
  pdl_release();
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, c = i % inter;
    const float g = gate_up[r * 2 * inter + c] + (gate_bias != nullptr ? gate_bias[c] : 0.0f);
    const float u = gate_up[r * 2 * inter + inter + c] + (up_bias != nullptr ? up_bias[c] : 0.0f);
    const float a = act == Activation::kSilu
                        ? g / (1.0f + expf(-g))
                        : 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
    store_elem(out, out_elem, i, a * u);
  }
}

__global__ void residual_kernel(float* x, const float* y, int64_t dim, const float* bias,
                                const float* post_norm, float eps) {
  pdl_wait();
  pdl_release();
  const int64_t row = blockIdx.x;
  const float* yr = y + row * dim;
  float* xr = x + row * dim;
  float inv = 1.0f;
  if (post_norm != nullptr) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = yr[i] + (bias != nullptr ? bias[i] : 0.0f);
      s += double(v) * v;
    }
    s = block_sum(s);
    inv = float(1.0 / sqrt(s / double(dim) + double(eps)));
  }
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = yr[i] + (bias != nullptr ? bias[i] : 0.0f);
    xr[i] += post_norm != nullptr ? (v * inv) * post_norm[i] : v;
  }
}

// x[r] += y[r] + bias, then out[r] = rms_norm(x[r]) * w: residual_kernel (no post norm) and
// rms_norm_kernel in one pass, with their operation order (the same bits).
__global__ void residual_norm_kernel(float* x, const float* y, int64_t dim, const float* bias,
                                     const float* w, float eps, void* out, Elem out_elem) {
  pdl_wait();
  pdl_release();
  const int64_t row = blockIdx.x;
  const float* yr = y + row * dim;
  float* xr = x + row * dim;
  double s = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] + (yr[i] + (bias != nullptr ? bias[i] : 0.0f));
    xr[i] = v;
    s += double(v) * v;
  }
  s = block_sum(s);
  const float inv = float(1.0 / sqrt(s / double(dim) + double(eps)));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    store_elem(out, out_elem, row * dim + i, (xr[i] * inv) * w[i]);
  }
}

__global__ void cast_kernel(const float* x, int64_t n, void* out, Elem elem) {
  pdl_wait();
  pdl_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    store_elem(out, elem, i, x[i]);
  }
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  pdl_wait();
  pdl_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    x[i] = cap * tanhf(x[i] / cap);
  }
}

__global__ void gather_kernel(const float* x, int64_t dim, const int32_t* rows, float* out) {
  pdl_wait();
  pdl_release();
  const int64_t i = blockIdx.x;
  const float* src = x + int64_t(rows[i]) * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) out[i * dim + c] = src[c];
}

// (value, index) better than (bv, bi): larger, or equal with a lower index; NaN never wins.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (isnan(v)) return false;
  if (isnan(bv)) return true;
  return v > bv || (v == bv && i < bi);
}

__device__ void block_argmax(float& v, int& i) {
  __shared__ float sv[32];
  __shared__ int si[32];
  for (int o = 16; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) sv[warp] = v, si[warp] = i;
  __syncthreads();
  v = sv[0];
  i = si[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w) {
    if (better(sv[w], si[w], v, i)) v = sv[w], i = si[w];
  }
}

__global__ void argmax_kernel(const float* logits, int64_t vocab, int32_t* out) {
  pdl_wait();
  pdl_release();
  const int64_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  float v = NAN;
  int idx = INT_MAX;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    if (better(l[j], int(j), v, idx)) v = l[j], idx = int(j);
  }
  block_argmax(v, idx);
  if (threadIdx.x == 0) out[row] = idx == INT_MAX ? 0 : idx;
}

__global__ void moe_route_kernel(const float* logits, int experts, int top_k, bool norm_topk,
                                 int32_t* expert_ids, float* weights) {
  extern __shared__ float p[];  // [experts]
  const int64_t t = blockIdx.x;
  const float* l = logits + t * experts;
  float v = NAN;
  int idx = INT_MAX;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    if (better(l[e], e, v, idx)) v = l[e], idx = e;
  }
  block_argmax(v, idx);
  const float max = v;
  double s = 0;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    p[e] = expf(l[e] - max);
    s += p[e];
  }
  s = block_sum(s);
  for (int e = threadIdx.x; e < experts; e += blockDim.x) p[e] = float(p[e] / s);
  __syncthreads();
  // top_k rounds of argmax over the experts not taken yet (taken ones are set to -inf).
  __shared__ float chosen_p[64];
  __shared__ int chosen[64];
  for (int k = 0; k < top_k; ++k) {
    float bv = NAN;
    int bi = INT_MAX;
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
      if (better(p[e], e, bv, bi)) bv = p[e], bi = e;
    }
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
      chosen[k] = bi;
      chosen_p[k] = bv;
      p[bi] = -INFINITY;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float top_sum = 0;
    for (int k = 0; k < top_k; ++k) top_sum += chosen_p[k];
    for (int k = 0; k < top_k; ++k) {
      expert_ids[t * top_k + k] = chosen[k];
      weights[t * top_k + k] = norm_topk ? chosen_p[k] / top_sum : chosen_p[k];
    }
  }
}

__global__ void scatter_add_kernel(float* out, const float* y, const int32_t* token,
                                   const float* weight, int64_t dim) {
  const int64_t i = blockIdx.x;
  float* o = out + int64_t(token[i]) * dim;
  const float w = weight[i];
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] += y[i * dim + c] * w;
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Box-Muller on two 24-bit uniforms of splitmix64(seed, i).
__global__ void fill_normal_kernel(float* out, int64_t n, uint64_t seed, float stddev) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed * 0x9E3779B97F4A7C15ull + uint64_t(i));
    const float u1 = (float((r >> 40) & 0xFFFFFF) + 0.5f) / 16777216.0f;
    const float u2 = float((r >> 16) & 0xFFFFFF) / 16777216.0f;
    out[i] = stddev * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  }
}

void check_rows(int64_t rows, const char* what) {
  if (rows < 0 || rows > int64_t(INT32_MAX)) {
    throw InvalidArgument(str_cat(what, ": ", rows, " rows is out of range"));
  }
}

}  // namespace

void embed_rows(const void* table, Elem elem, int64_t cols, const int32_t* ids, int64_t n,
                float scale, float* out, cudaStream_t stream) {
  check_rows(n, "embed_rows");
  if (n == 0) return;
  if (n > 65535) throw InvalidArgument(str_cat("embed_rows: ", n, " rows, at most 65535"));
  const int64_t col_blocks = std::min<int64_t>((cols + kThreads - 1) / kThreads, 64);
  launch_pdl(embed_kernel, dim3(unsigned(std::max<int64_t>(col_blocks, 1)), unsigned(n)),
             dim3(kThreads), 0, stream, table, elem, cols, ids, scale, out);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, void* out,
              Elem out_elem, cudaStream_t stream) {
  check_rows(rows, "rms_norm");
  if (rows == 0) return;
  if (vector_rows(dim, {x, weight, out}) && x != out) {
    launch_pdl(row_norm_vec_kernel, dim3(unsigned(rows)), dim3(kRowThreads), 0, stream,
               const_cast<float*>(x), static_cast<const float*>(nullptr),
               static_cast<const float*>(nullptr), dim, weight, eps, out, out_elem);
    return;
  }
  launch_pdl(rms_norm_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, dim, weight, eps,
             out, out_elem);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void qkv_post(const QkvPostProblem& p, cudaStream_t stream) {
  check_rows(p.tokens, "qkv_post");
  if (p.tokens == 0) return;
  if (p.head_dim < 1 || p.head_dim > 1024 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim) {
    throw InvalidArgument(str_cat("qkv_post: head_dim ", p.head_dim, ", rotary_dim ",
                                  p.rotary_dim, ": need an even rotary_dim <= head_dim <= 1024"));
  }
  const dim3 grid(unsigned(p.tokens), unsigned(p.heads + 2 * p.kv_heads));
  launch_pdl(qkv_post_kernel, grid, dim3(128), size_t(p.head_dim) * sizeof(float), stream, p);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void gated_activation(const float* gate_up, int64_t rows, int64_t inter, const float* gate_bias,
                      const float* up_bias, Activation act, void* out, Elem out_elem,
                      cudaStream_t stream) {
  if (rows * inter == 0) return;
  launch_pdl(gated_kernel, dim3(grid_for(rows * inter)), dim3(kThreads), 0, stream, gate_up, rows,
             inter, gate_bias, up_bias, act, out, out_elem);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void residual_add(float* x, const float* y, int64_t rows, int64_t dim, const float* bias,
                  const float* post_norm, float eps, cudaStream_t stream) {
  check_rows(rows, "residual_add");
  if (rows == 0) return;
  if (post_norm == nullptr && vector_rows(dim, {x, y, bias})) {
    const int64_t n4 = rows * dim / 4;
    launch_pdl(residual_vec_kernel, dim3(grid_for(n4)), dim3(kThreads), 0, stream,
               reinterpret_cast<float4*>(x), reinterpret_cast<const float4*>(y), n4, dim / 4,
               reinterpret_cast<const float4*>(bias));
    return;
  }
  launch_pdl(residual_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, y, dim, bias,
             post_norm, eps);
}

void residual_add_norm(float* x, const float* y, int64_t rows, int64_t dim, const float* bias,
                       const float* weight, float eps, void* out, Elem out_elem,
                       cudaStream_t stream) {
  check_rows(rows, "residual_add_norm");
  if (rows == 0) return;
  if (vector_rows(dim, {x, y, bias, weight, out})) {
    launch_pdl(row_norm_vec_kernel, dim3(unsigned(rows)), dim3(kRowThreads), 0, stream, x, y,
               bias, dim, weight, eps, out, out_elem);
    return;
  }
  launch_pdl(residual_norm_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, y, dim,
             bias, weight, eps, out, out_elem);
}

void cast(const float* x, int64_t n, void* out, Elem elem, cudaStream_t stream) {
  if (n == 0) return;
  launch_pdl(cast_kernel, dim3(grid_for(n)), dim3(kThreads), 0, stream, x, n, out, elem);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return;
  launch_pdl(softcap_kernel, dim3(grid_for(n)), dim3(kThreads), 0, stream, x, n, cap);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out,
                 cudaStream_t stream) {
  check_rows(n, "gather_rows");
  if (n == 0) return;
  if (vector_rows(dim, {x, out}) && n <= 65535) {
    const dim3 grid(unsigned((dim / 4 + kThreads - 1) / kThreads), unsigned(n));
    launch_pdl(gather_vec_kernel, grid, dim3(kThreads), 0, stream, x, dim, rows, out);
    return;
  }
  launch_pdl(gather_kernel, dim3(unsigned(n)), dim3(kThreads), 0, stream, x, dim, rows, out);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out,
                 cudaStream_t stream) {
  check_rows(rows, "argmax_rows");
  if (rows == 0) return;
  launch_pdl(argmax_kernel, dim3(unsigned(rows)), dim3(1024), 0, stream, logits, vocab, out);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void moe_route(const float* logits, int64_t tokens, int experts, int top_k, bool norm_topk,
               int32_t* expert_ids, float* weights, cudaStream_t stream) {
  check_rows(tokens, "moe_route");
  if (experts < 1 || experts > 1024 || top_k < 1 || top_k > experts || top_k > 64) {
    throw InvalidArgument(str_cat("moe_route: ", experts, " experts, top ", top_k,
                                  ": need 1 <= top_k <= 64, top_k <= experts <= 1024"));
  }
  if (tokens == 0) return;
  moe_route_kernel<<<unsigned(tokens), kThreads, size_t(experts) * sizeof(float), stream>>>(
      logits, experts, top_k, norm_topk, expert_ids, weights);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void fill_normal(float* out, int64_t n, uint64_t seed, float stddev, cudaStream_t stream) {
  if (n == 0) return;
  fill_normal_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, n, seed, stddev);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

void scatter_add_weighted(float* out, const float* y, const int32_t* token, const float* weight,
                          int64_t n, int64_t dim, cudaStream_t stream) {
  check_rows(n, "scatter_add_weighted");
  if (n == 0) return;
  scatter_add_kernel<<<unsigned(n), kThreads, 0, stream>>>(out, y, token, weight, dim);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

}  // namespace turbokv::cuda
