// The decode GEMV on quantized rows, y [m, rows] = x [m, cols] · dequant(W)ᵀ for m <= 8, one
// kernel per (format trait, M in {1, 2, 4, 8}); rows of x past m are zeros.
//
// Block: 8 warps, 16 weight rows (2 per warp). Per pass over a chunk of columns the block
// stages x[0..M)[chunk] in shared memory (fp32, 4 floats of padding after every kXGroup so
// that lanes reading 16-byte pieces of consecutive units hit distinct banks) and, for formats
// with offsets (Q4_K, MLX affine), the sum of every 32 consecutive values. Each lane takes
// units lane, lane + 32, ... of the chunk: it loads the unit of both rows (16-byte loads where
// the layout allows; the first units are requested before x is staged), and per sub-block
// accumulates Σ value·x for all M rows of x from the same registers, then scale·Σ
// (+ offset·Σx). Every weight byte is read once from memory, every x value once per pair of
// rows from shared memory; a warp-wide reduction ends each row.
//
// Why this shape: at HBM3e speed (4.8 TB/s over 132 SMs) a 4-bit row streams at ~24 values
// per clock per SM, which leaves ~5 issue slots per value. byte_value unpacks a value in one
// PRMT + one FADD (int -> float conversions run at 16 per clock per SM, too slow), the nibble
// masks cost ~0.4 per value, the products M, and shared-memory reads of x are shared by the
// 2 rows; at m = 1 that is ~3.5-4 per value. Two or three blocks per SM keep ~40-60 KB of
// weight loads in flight, above the ~30 KB that latency times bandwidth needs.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/qmatmul/formats.cuh"
#include "kernels/cuda/qmatmul/params.h"

namespace turbokv::cuda::qmm {

constexpr int kGemvWarps = 8;
constexpr int kGemvRowsPerWarp = 2;
constexpr int kGemvRowsPerBlock = kGemvWarps * kGemvRowsPerWarp;
// Shared memory of any (M, chunk) gemv_chunk returns: M * chunk * (1 + 4/32 + 1/32) floats.
constexpr int kGemvMaxSmemBytes = kGemvStagedFloats * 4 * (32 + 4 + 1) / 32;

// Index of chunk column k in a staged x row: 4 floats of padding after every G columns.
template <int G>
__host__ __device__ constexpr int padded(int k) {
  return k + 4 * (k / G);
}
template <int G>
__host__ __device__ constexpr int padded_stride(int chunk) {
  return chunk + 4 * (chunk / G);
}

// x[0..M)[k0, k0 + kc) -> xs (rows of x_stride floats, padded) and, for formats with offset
// terms, the sum of each 32 columns -> xsum (rows of xsum_stride). The loads are independent
// (unrolled, several in flight per thread); the sums are a second pass over shared memory.
template <int M, int G, bool kSums>
__device__ void stage_x(const GemvArgs& a, int64_t k0, int kc, float* xs, int x_stride, float* xsum,
                        int xsum_stride) {
  const int per_row = kc / 4;  // float4s of one x row in this chunk
#pragma unroll 4
  for (int idx = threadIdx.x; idx < M * per_row; idx += kGemvWarps * 32) {
    const int i = idx / per_row, f = idx - i * per_row;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < a.m) v = __ldg(reinterpret_cast<const float4*>(a.x + int64_t(i) * a.w.cols + k0) + f);
    *reinterpret_cast<float4*>(xs + i * x_stride + padded<G>(4 * f)) = v;
  }
  if constexpr (kSums) {
    __syncthreads();
    const int spans = kc / 32;
    for (int t = threadIdx.x; t < M * spans; t += kGemvWarps * 32) {
      const int i = t / spans, span = t - i * spans;
      // The 32 columns of a span are contiguous in xs (G >= 32).
      const float* p = xs + i * x_stride + padded<G>(32 * span);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(p + 4 * j);
        sum += (v.x + v.y) + (v.z + v.w);
      }
      xsum[i * xsum_stride + span] = sum;
    }
  }
}

// unit[j][r] = unit u + 32j of row[r], for the j with u + 32j < u_end.
template <class F, int U, int R>
__device__ __forceinline__ void load_units(const WeightArgs& w, const int64_t (&row)[R], int64_t u,
                                           int64_t u_end, typename F::Unit (&unit)[U][R]) {
#pragma unroll
  for (int j = 0; j < U; ++j) {
    if (u + 32 * j < u_end) {
#pragma unroll
      for (int r = 0; r < R; ++r) unit[j][r] = F::load(w, row[r], u + 32 * j);
    }
  }
}

// acc[r][i] += Σ_v w_r[v] · x_i[k + col(v)] over one unit of each of the R rows, where k is
// the chunk column of the unit's value 0, a multiple of kXGroup (and of 32): so the padded
// index of k + col(v) is padded(k) + padded(col(v)), a constant offset per v.
template <class F, int M, int R>
__device__ __forceinline__ void accumulate_unit(const typename F::Unit (&unit)[R], const float* xs,
                                                int x_stride, const float* xsum, int xsum_stride,
                                                int k, float (&acc)[R][M]) {
  const float* xk = xs + padded<F::kXGroup>(k);
  const float* sum_k = xsum + k / 32;
#pragma unroll
  for (int s = 0; s < F::kSpan / F::kSub; ++s) {
    float part[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < M; ++i) part[r][i] = 0.0f;
    }
#pragma unroll
    for (int v = s * F::kSub; v < (s + 1) * F::kSub; v += 4) {
      float4 x4[M];
      const int at = padded<F::kXGroup>(F::col(v));
#pragma unroll
      for (int i = 0; i < M; ++i) x4[i] = *reinterpret_cast<const float4*>(xk + i * x_stride + at);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float q0 = F::value(unit[r], v), q1 = F::value(unit[r], v + 1);
        const float q2 = F::value(unit[r], v + 2), q3 = F::value(unit[r], v + 3);
#pragma unroll
        for (int i = 0; i < M; ++i) {
          part[r][i] = fmaf(q0, x4[i].x, part[r][i]);
          part[r][i] = fmaf(q1, x4[i].y, part[r][i]);
          part[r][i] = fmaf(q2, x4[i].z, part[r][i]);
          part[r][i] = fmaf(q3, x4[i].w, part[r][i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float sum_x = 0.0f;
      if constexpr (F::kHasOffset) sum_x = sum_k[i * xsum_stride + F::col(s * F::kSub) / 32];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        acc[r][i] = fmaf(F::scale(unit[r], s), part[r][i], acc[r][i]);
        if constexpr (F::kHasOffset) acc[r][i] = fmaf(F::offset(unit[r], s), sum_x, acc[r][i]);
      }
    }
  }
}

template <class F, int M>
__global__ void __launch_bounds__(kGemvWarps * 32, 2) gemv_kernel(const GemvArgs a) {
  constexpr int R = kGemvRowsPerWarp;
  constexpr int kUnroll = M <= 2 ? F::kUnroll : 1;
  constexpr bool kPrefetch = M <= 4;
  extern __shared__ float4 smem[];
  float* xs = reinterpret_cast<float*>(smem);  // [M, x_stride]
  const int x_stride = padded_stride<F::kXGroup>(a.chunk);
  float* xsum = xs + M * x_stride;  // [M, chunk / 32]
  const int xsum_stride = a.chunk / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = (int64_t(blockIdx.x) * kGemvWarps + warp) * R;
  const bool active = row0 < a.w.rows;
  int64_t row[R];  // rows past the end repeat the last one (loaded, never written)
#pragma unroll
  for (int r = 0; r < R; ++r) row[r] = min(row0 + r, a.w.rows - 1);
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;
  }

  for (int64_t k0 = 0; k0 < a.w.cols; k0 += a.chunk) {
    const int kc = int(min(int64_t(a.chunk), a.w.cols - k0));
    const int64_t u_first = k0 / F::kSpan + lane, u_end = (k0 + kc) / F::kSpan;
    typename F::Unit unit[kUnroll][R];
    // The first units are in flight from memory while x is staged (not at M = 8, where the
    // registers they hold through the staging would spill).
    if (kPrefetch && active) load_units<F>(a.w, row, u_first, u_end, unit);
    __syncthreads();  // the previous chunk's readers of xs are done
    stage_x<M, F::kXGroup, F::kHasOffset>(a, k0, kc, xs, x_stride, xsum, xsum_stride);
    __syncthreads();
    if (!active) continue;
    for (int64_t u = u_first; u < u_end; u += 32 * kUnroll) {
      if (!kPrefetch || u != u_first) load_units<F>(a.w, row, u, u_end, unit);
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        if (u + 32 * j < u_end) {
          accumulate_unit<F, M, R>(unit[j], xs, x_stride, xsum, xsum_stride,
                                   int(F::first_col(u + 32 * j) - k0), acc);
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float v = acc[r][i];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && row0 + r < a.w.rows && i < a.m) a.y[int64_t(i) * a.ldy + row0 + r] = v;
    }
  }
}

// The shared-memory limit of gemv_kernel<F, M>, set once per device (a per-context attribute).
template <class F, int M>
void configure_gemv() {
  static std::atomic<uint32_t> configured{0};  // bit d: device d
  int device = 0;
  TURBOKV_CUDA_CHECK(cudaGetDevice(&device));
  const uint32_t bit = device < 32 ? 1u << device : 0u;
  if (bit != 0 && (configured.load(std::memory_order_acquire) & bit) != 0) return;
  TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(
      gemv_kernel<F, M>, cudaFuncAttributeMaxDynamicSharedMemorySize, kGemvMaxSmemBytes));
  configured.fetch_or(bit, std::memory_order_release);
}

template <class F, int M>
void run_gemv(const GemvArgs& a, cudaStream_t stream) {
  configure_gemv<F, M>();
  const size_t smem =
      sizeof(float) * size_t(M) * size_t(padded_stride<F::kXGroup>(a.chunk) + a.chunk / 32);
  const int64_t blocks = (a.w.rows + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock;
  gemv_kernel<F, M><<<unsigned(blocks), kGemvWarps * 32, smem, stream>>>(a);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

// The instantiations of one format: M = 1, 2, 4, 8 (m rounded up).
template <class F>
void run_gemv_any_m(const GemvArgs& a, cudaStream_t stream) {
  if (a.m == 1) return run_gemv<F, 1>(a, stream);
  if (a.m == 2) return run_gemv<F, 2>(a, stream);
  if (a.m <= 4) return run_gemv<F, 4>(a, stream);
  return run_gemv<F, 8>(a, stream);
}

}  // namespace turbokv::cuda::qmm
