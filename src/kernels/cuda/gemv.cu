// Dense fp16 / bf16 GEMV for decode (gemv.h).
#include "kernels/cuda/gemv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"

namespace turbokv::cuda {
namespace {

constexpr int kWarps = 8;   // rows per block
constexpr int kUnroll = 4;  // 16-B chunks of the row in flight per lane

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 x;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
               : "l"(p));
  return x;
}

// The two elements of a 32-bit word as floats (low element first).
template <typename T>
__device__ __forceinline__ float2 widen2(uint32_t u);
template <>
__device__ __forceinline__ float2 widen2<__nv_bfloat16>(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 widen2<__half>(uint32_t u) {
  return make_float2(__half2float(__ushort_as_half(uint16_t(u & 0xffffu))),
                     __half2float(__ushort_as_half(uint16_t(u >> 16))));
}

// Two floats rounded to T (as cast() rounds them), packed low element first.
template <typename T>
__device__ __forceinline__ uint32_t narrow2(float a, float b);
template <>
__device__ __forceinline__ uint32_t narrow2<__nv_bfloat16>(float a, float b) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
         uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16;
}
template <>
__device__ __forceinline__ uint32_t narrow2<__half>(float a, float b) {
  return uint32_t(__half_as_ushort(__float2half_rn(a))) |
         uint32_t(__half_as_ushort(__float2half_rn(b))) << 16;
}

// Chunk c (8 elements) of x as T: loaded as it is, or fp32 narrowed on the fly.
template <typename T, bool kF32Input>
__device__ __forceinline__ uint4 x_chunk(const void* x, int64_t c) {
  if constexpr (kF32Input) {
    const float4* p = static_cast<const float4*>(x) + 2 * c;
    const float4 a = __ldg(p), b = __ldg(p + 1);
    return make_uint4(narrow2<T>(a.x, a.y), narrow2<T>(a.z, a.w), narrow2<T>(b.x, b.y),
                      narrow2<T>(b.z, b.w));
  } else {
    return __ldg(static_cast<const uint4*>(x) + c);
  }
}

template <typename T>
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = widen2<T>(ws[i]), b = widen2<T>(xs[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// The first round of a weight row's chunks (chunks lane + 32 u, u < kUnroll) when the row has
// a whole round. Weights are never written by a kernel, so PDL-launched kernels load them
// before waiting for the previous kernel: the first HBM round trip overlaps its end.
template <int R>
__device__ __forceinline__ void first_round(const uint4* const (&wr)[R], int64_t chunks, int lane,
                                            bool valid, uint4 (&wv)[R][kUnroll]) {
  if (!valid || lane + 32 * (kUnroll - 1) >= chunks) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[r][u] = load_stream(wr[r] + lane + 32 * u);
  }
}

// Launched with PDL (launch.h): loads its first round of weights, waits for the previous
// kernel, releases the next one after its loop.
template <typename T, int M, bool kF32Input>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const void* __restrict__ x, const T* __restrict__ w, int64_t n, int64_t k,
                float* __restrict__ y, int64_t ldy, int accumulate) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  const int64_t chunks = k / 8;
  const uint4* const wr[1] = {reinterpret_cast<const uint4*>(w + (row < n ? row : 0) * k)};
  uint4 wv[1][kUnroll];
  first_round<1>(wr, chunks, lane, row < n, wv);
  pdl_wait();
  if (row >= n) return;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0;
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    if (c != lane) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[0][u] = load_stream(wr[0] + c + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        acc[m] = dot8<T>(wv[0][u], x_chunk<T, kF32Input>(x, m * chunks + c + 32 * u), acc[m]);
      }
    }
  }
  for (; c < chunks; c += 32) {
    const uint4 wv = load_stream(wr[0] + c);
#pragma unroll
    for (int m = 0; m < M; ++m)
      acc[m] = dot8<T>(wv, x_chunk<T, kF32Input>(x, m * chunks + c), acc[m]);
  }
  pdl_release();
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float s = acc[m];
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    acc[m] = s;
  }
  if (lane < M) {
    float s = acc[0];
#pragma unroll
    for (int m = 1; m < M; ++m) s = lane == m ? acc[m] : s;
    float* out = y + int64_t(lane) * ldy + row;
    *out = accumulate ? *out + s : s;
  }
}

// Rows wr[0..R) of w against the M rows of x, their loads interleaved (R * kUnroll chunks in
// flight per lane), the first round already in wv (first_round): each row's partial sums in
// the order of gemv_kernel, then the same shuffle tree (every lane gets the sums), so a row's
// result does not depend on R.
template <typename T, int M, int R>
__device__ __forceinline__ void row_dots(const void* x, const uint4* const (&wr)[R], int64_t k,
                                         int lane, uint4 (&wv)[R][kUnroll], float (&acc)[R][M]) {
  const int64_t chunks = k / 8;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0;
  }
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    if (c != lane) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[r][u] = load_stream(wr[r] + c + 32 * u);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const uint4 xv = x_chunk<T, false>(x, m * chunks + c + 32 * u);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][m] = dot8<T>(wv[r][u], xv, acc[r][m]);
      }
    }
  }
  for (; c < chunks; c += 32) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 wv = load_stream(wr[r] + c);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        acc[r][m] = dot8<T>(wv, x_chunk<T, false>(x, m * chunks + c), acc[r][m]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = acc[r][m];
      for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      acc[r][m] = s;
    }
  }
}

// One warp per intermediate column i: gate row i and up row i of w [2 inter, k], then
// act(gate + gate_bias) * (up + up_bias) narrowed to T (gated_activation's arithmetic).
template <typename T, int M>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_gated_kernel(const void* __restrict__ x, const T* __restrict__ w, int64_t inter, int64_t k,
                      const float* gate_bias, const float* up_bias, Activation act,
                      T* __restrict__ out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = int64_t(blockIdx.x) * kWarps + warp;
  const int64_t gate = i < inter ? i : 0;
  const uint4* const wr[2] = {reinterpret_cast<const uint4*>(w + gate * k),             // gate row
                              reinterpret_cast<const uint4*>(w + (inter + gate) * k)};  // up row
  uint4 wv[2][kUnroll];
  first_round<2>(wr, k / 8, lane, i < inter, wv);  // weights: before the wait (first_round)
  pdl_wait();
  if (i >= inter) return;
  float acc[2][M];
  row_dots<T, M, 2>(x, wr, k, lane, wv, acc);
  pdl_release();
  if (lane < M) {
    float gs = acc[0][0], us = acc[1][0];
#pragma unroll
    for (int m = 1; m < M; ++m) {
      gs = lane == m ? acc[0][m] : gs;
      us = lane == m ? acc[1][m] : us;
    }
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    const float gv = gs + (gate_bias != nullptr ? gate_bias[i] : 0.0f);
    const float uv = us + (up_bias != nullptr ? up_bias[i] : 0.0f);
    const float a =
        act == Activation::kSilu
            ? gv / (1.0f + expf(-gv))
            : 0.5f * gv * (1.0f + tanhf(kSqrt2OverPi * (gv + 0.044715f * gv * gv * gv)));
    const float y = a * uv;
    T* o = out + int64_t(lane) * inter + i;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      *o = __float2bfloat16_rn(y);
    } else {
      *o = __float2half_rn(y);
    }
  }
}

template <typename T, bool kF32Input>
void launch(const void* x, const void* w, int64_t m, int64_t n, int64_t k, float* y, int64_t ldy,
            bool accumulate, cudaStream_t stream) {
  const dim3 blocks(unsigned((n + kWarps - 1) / kWarps));
  const T* wt = static_cast<const T*>(w);
  const int acc = accumulate ? 1 : 0;
  switch (m) {
#define TURBOKV_GEMV_CASE(M)                                                                       \
  case M:                                                                                          \
    launch_pdl(gemv_kernel<T, M, kF32Input>, blocks, dim3(kWarps * 32), 0, stream, x, wt, n, k, y, \
               ldy, acc);                                                                          \
    break;
    TURBOKV_GEMV_CASE(1)
    TURBOKV_GEMV_CASE(2)
    TURBOKV_GEMV_CASE(3)
    TURBOKV_GEMV_CASE(4)
    TURBOKV_GEMV_CASE(5)
    TURBOKV_GEMV_CASE(6)
    TURBOKV_GEMV_CASE(7)
    TURBOKV_GEMV_CASE(8)
#undef TURBOKV_GEMV_CASE
  }
}

}  // namespace

bool gemv_supported(const void* x, const void* w, Elem elem, int64_t m, int64_t k) {
  return (elem == Elem::kBF16 || elem == Elem::kF16) && m >= 1 && m <= kGemvMaxRows && k >= 8 &&
         k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

namespace {

void run(const void* x, bool f32_input, const void* w, Elem elem, int64_t m, int64_t n, int64_t k,
         float* y, int64_t ldy, bool accumulate, cudaStream_t stream) {
  if (n == 0) return;
  if (!gemv_supported(x, w, elem, m, k) || n < 0 || ldy < n || n > (int64_t(1) << 36)) {
    throw InvalidArgument(str_cat("gemv: m ", m, ", n ", n, ", k ", k, ", ldy ", ldy,
                                  ": needs fp16/bf16, m 1..", kGemvMaxRows,
                                  ", k a multiple of 8 and 16-B aligned operands"));
  }
  if (elem == Elem::kBF16) {
    if (f32_input) {
      launch<__nv_bfloat16, true>(x, w, m, n, k, y, ldy, accumulate, stream);
    } else {
      launch<__nv_bfloat16, false>(x, w, m, n, k, y, ldy, accumulate, stream);
    }
  } else if (f32_input) {
    launch<__half, true>(x, w, m, n, k, y, ldy, accumulate, stream);
  } else {
    launch<__half, false>(x, w, m, n, k, y, ldy, accumulate, stream);
  }
}

}  // namespace

void gemv(const void* x, const void* w, Elem elem, int64_t m, int64_t n, int64_t k, float* y,
          int64_t ldy, bool accumulate, cudaStream_t stream) {
  run(x, false, w, elem, m, n, k, y, ldy, accumulate, stream);
}

void gemv_f32_input(const float* x, const void* w, Elem elem, int64_t m, int64_t n, int64_t k,
                    float* y, int64_t ldy, bool accumulate, cudaStream_t stream) {
  run(x, true, w, elem, m, n, k, y, ldy, accumulate, stream);
}

namespace {

template <typename T>
void launch_gated(const void* x, const void* w, int64_t m, int64_t inter, int64_t k,
                  const float* gate_bias, const float* up_bias, Activation act, void* out,
                  cudaStream_t stream) {
  const dim3 blocks(unsigned((inter + kWarps - 1) / kWarps));
  const T* wt = static_cast<const T*>(w);
  T* o = static_cast<T*>(out);
  switch (m) {
#define TURBOKV_GATED_CASE(M)                                                                  \
  case M:                                                                                      \
    launch_pdl(gemv_gated_kernel<T, M>, blocks, dim3(kWarps * 32), 0, stream, x, wt, inter, k, \
               gate_bias, up_bias, act, o);                                                    \
    break;
    TURBOKV_GATED_CASE(1)
    TURBOKV_GATED_CASE(2)
    TURBOKV_GATED_CASE(3)
    TURBOKV_GATED_CASE(4)
    TURBOKV_GATED_CASE(5)
    TURBOKV_GATED_CASE(6)
    TURBOKV_GATED_CASE(7)
    TURBOKV_GATED_CASE(8)
#undef TURBOKV_GATED_CASE
  }
}

}  // namespace

void gemv_gated(const void* x, const void* w, Elem elem, int64_t m, int64_t inter, int64_t k,
                const float* gate_bias, const float* up_bias, Activation act, void* out,
                cudaStream_t stream) {
  if (inter == 0) return;
  if (!gemv_supported(x, w, elem, m, k) || inter < 0 || inter > (int64_t(1) << 35)) {
    throw InvalidArgument(str_cat("gemv_gated: m ", m, ", inter ", inter, ", k ", k,
                                  ": needs fp16/bf16, m 1..", kGemvMaxRows,
                                  ", k a multiple of 8 and 16-B aligned operands"));
  }
  if (elem == Elem::kBF16) {
    launch_gated<__nv_bfloat16>(x, w, m, inter, k, gate_bias, up_bias, act, out, stream);
  } else {
    launch_gated<__half>(x, w, m, inter, k, gate_bias, up_bias, act, out, stream);
  }
}

}  // namespace turbokv::cuda
