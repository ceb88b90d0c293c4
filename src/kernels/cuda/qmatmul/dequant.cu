// Dequantization to bf16 for the prefill GEMM and of gathered rows to fp32 for embedding
// lookups, one thread per unit of formats.cuh (its loads are the GEMV's), and the fp32 -> bf16
// narrowing of the activations. Every value is computed with the reference's operations in
// its order (explicitly rounded products and sums, no contraction), so the results equal
// dequantize_rows_ref's floats (rounded to bf16) and gather_rows_ref's.
#include <cuda_bf16.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/qmatmul/formats.cuh"
#include "kernels/cuda/qmatmul/params.h"

namespace turbokv::cuda::qmm {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // grid-stride beyond this

template <class F>
__device__ __forceinline__ float weight(const typename F::Unit& unit, int v) {
  const float scaled = __fmul_rn(F::scale(unit, v / F::kSub), F::value(unit, v));
  if constexpr (F::kHasOffset) return __fadd_rn(scaled, F::offset(unit, v / F::kSub));
  return scaled;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return l | (h << 16);
}

// out [rows, cols]: unit t of the flattened [rows, units per row] grid per thread; every run
// of 8 values is contiguous in the row and lands in one 16-byte store.
template <class F>
__global__ void __launch_bounds__(kThreads)
    dequant_kernel(const WeightArgs w, int64_t row_begin, int64_t rows, __nv_bfloat16* out) {
  const int64_t units_per_row = w.cols / F::kSpan;
  const int64_t total = rows * units_per_row;
  for (int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * kThreads) {
    const int64_t r = t / units_per_row, u = t - r * units_per_row;
    const typename F::Unit unit = F::load(w, row_begin + r, u);
    __nv_bfloat16* dst = out + r * w.cols + F::first_col(u);
#pragma unroll
    for (int v = 0; v < F::kSpan; v += 8) {
      uint4 packed;
      packed.x = pack_bf16x2(weight<F>(unit, v), weight<F>(unit, v + 1));
      packed.y = pack_bf16x2(weight<F>(unit, v + 2), weight<F>(unit, v + 3));
      packed.z = pack_bf16x2(weight<F>(unit, v + 4), weight<F>(unit, v + 5));
      packed.w = pack_bf16x2(weight<F>(unit, v + 6), weight<F>(unit, v + 7));
      *reinterpret_cast<uint4*>(dst + F::col(v)) = packed;
    }
  }
}

template <class F>
void run_dequant(const WeightArgs& w, int64_t row_begin, int64_t rows, __nv_bfloat16* out,
                 cudaStream_t stream) {
  const int64_t total = rows * (w.cols / F::kSpan);
  if (total == 0) return;
  const int64_t blocks = std::min((total + kThreads - 1) / kThreads, kMaxBlocks);
  dequant_kernel<F><<<unsigned(blocks), kThreads, 0, stream>>>(w, row_begin, rows, out);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

// out [n, cols] fp32: unit t of the flattened [n, units per row] grid per thread, each run of
// 4 values one 16-byte store.
template <class F>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const WeightArgs w, const int32_t* ids, int64_t n, float scale, float* out) {
  const int64_t units_per_row = w.cols / F::kSpan;
  for (int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x; t < n * units_per_row;
       t += int64_t(gridDim.x) * kThreads) {
    const int64_t r = t / units_per_row, u = t - r * units_per_row;
    const int32_t id = ids[r];
    float* dst = out + r * w.cols + F::first_col(u);
    if (id < 0 || id >= w.rows) {
      const float nan = __uint_as_float(0x7FC00000u);
#pragma unroll
      for (int v = 0; v < F::kSpan; v += 4) {
        *reinterpret_cast<float4*>(dst + F::col(v)) = make_float4(nan, nan, nan, nan);
      }
      continue;
    }
    const typename F::Unit unit = F::load(w, id, u);
#pragma unroll
    for (int v = 0; v < F::kSpan; v += 4) {
      *reinterpret_cast<float4*>(dst + F::col(v)) = make_float4(
          __fmul_rn(weight<F>(unit, v), scale), __fmul_rn(weight<F>(unit, v + 1), scale),
          __fmul_rn(weight<F>(unit, v + 2), scale), __fmul_rn(weight<F>(unit, v + 3), scale));
    }
  }
}

template <class F>
void run_gather(const WeightArgs& w, const int32_t* ids, int64_t n, float scale, float* out,
                cudaStream_t stream) {
  const int64_t total = n * (w.cols / F::kSpan);
  if (total == 0) return;
  const int64_t blocks = std::min((total + kThreads - 1) / kThreads, kMaxBlocks);
  gather_kernel<F><<<unsigned(blocks), kThreads, 0, stream>>>(w, ids, n, scale, out);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

__global__ void __launch_bounds__(kThreads)
    to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}

}  // namespace

void launch_dequant(Kind kind, const WeightArgs& w, int64_t row_begin, int64_t rows,
                    __nv_bfloat16* out, cudaStream_t stream) {
  switch (kind) {
    case Kind::kQ8_0:
      return run_dequant<FormatQ8_0>(w, row_begin, rows, out, stream);
    case Kind::kQ4_0:
      return run_dequant<FormatQ4_0>(w, row_begin, rows, out, stream);
    case Kind::kQ5_0:
      return run_dequant<FormatQ5_0>(w, row_begin, rows, out, stream);
    case Kind::kQ4_K:
      return run_dequant<FormatQ4_K>(w, row_begin, rows, out, stream);
    case Kind::kQ6_K:
      return run_dequant<FormatQ6_K>(w, row_begin, rows, out, stream);
    case Kind::kAffine2:
      return run_dequant<FormatAffine<2>>(w, row_begin, rows, out, stream);
    case Kind::kAffine4:
      return run_dequant<FormatAffine<4>>(w, row_begin, rows, out, stream);
    case Kind::kAffine8:
      return run_dequant<FormatAffine<8>>(w, row_begin, rows, out, stream);
  }
  throw InvalidArgument(str_cat("launch_dequant: unknown kind ", int(kind)));
}

void launch_gather(Kind kind, const WeightArgs& w, const int32_t* ids, int64_t n, float scale,
                   float* out, cudaStream_t stream) {
  switch (kind) {
    case Kind::kQ8_0:
      return run_gather<FormatQ8_0>(w, ids, n, scale, out, stream);
    case Kind::kQ4_0:
      return run_gather<FormatQ4_0>(w, ids, n, scale, out, stream);
    case Kind::kQ5_0:
      return run_gather<FormatQ5_0>(w, ids, n, scale, out, stream);
    case Kind::kQ4_K:
      return run_gather<FormatQ4_K>(w, ids, n, scale, out, stream);
    case Kind::kQ6_K:
      return run_gather<FormatQ6_K>(w, ids, n, scale, out, stream);
    case Kind::kAffine2:
      return run_gather<FormatAffine<2>>(w, ids, n, scale, out, stream);
    case Kind::kAffine4:
      return run_gather<FormatAffine<4>>(w, ids, n, scale, out, stream);
    case Kind::kAffine8:
      return run_gather<FormatAffine<8>>(w, ids, n, scale, out, stream);
  }
  throw InvalidArgument(str_cat("launch_gather: unknown kind ", int(kind)));
}

void launch_to_bf16(const float* x, int64_t n, __nv_bfloat16* out, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocks);
  to_bf16_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(x, n, out);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

}  // namespace turbokv::cuda::qmm
