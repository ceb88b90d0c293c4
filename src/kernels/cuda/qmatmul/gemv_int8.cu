// The decode GEMV of MLX 4-bit weights on int8 activations (m = 1, qmatmul.h).
//
// Why: the fp32 GEMV (gemv.cuh) spends ~3.5 issue slots per weight (unpack to float, FFMA),
// about what the SMs have per weight at HBM speed, so it runs well below the memory rate. Here
// x is first quantized per block of 32 (llama.cpp's Q8_0 activations: d = max|x| / 127,
// q = rint(x / d)), and every 8 packed codes cost 3 integer ops and 2 dp4a: ~1 slot per weight.
//
// Activation layout (quantize_kernel): per 8 values [x0 x2 x4 x6 x1 x3 x5 x7], the order in
// which the low and high nibbles of one uint32 code word (values LSB-first) come out of
// w & 0x0F0F0F0F and (w >> 4) & 0x0F0F0F0F. d and d·Σq per 32-block follow the codes in the
// workspace. Σ (s·q + b)·x over a 32-block = s·d·Σ q·qx + b·(d·Σ qx).
//
// GEMV: blocks of 8 warps, 2 rows per warp; lane l takes 32-value units l, l + 32, ... of both
// rows, Units units per pass with all loads issued first (codes 16 B per unit and row, the
// activation bytes 32 B per unit from L1/L2, shared by the two rows). The shapes differ in
// registers, so in how many warps an SM keeps loading at once (Int8GemvShape): 4 units take
// 128 registers, two blocks per SM; 2 units bound to three blocks per SM take 80 (ptxas -v,
// no spills; bound to four blocks they spill).
//
// Both kernels are launched with programmatic dependent launch (launch.h): the GEMV's first
// weight loads are issued before it waits for the quantization of x, so that kernel and the
// launch gaps around it overlap the weight stream instead of preceding it.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/qmatmul.h"
#include "kernels/cuda/qmatmul/params.h"

namespace turbokv::cuda::qmm {
namespace {

constexpr int kWarps = 8, kRowsPerWarp = 2;

__device__ __forceinline__ float scale_value(uint32_t bits, bool bf16) {
  return bf16 ? __uint_as_float(bits << 16)
              : __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// One warp per 32-block of x.
__global__ void quantize_kernel(const float* __restrict__ x, int64_t blocks,
                                int8_t* __restrict__ xq, float* __restrict__ xd,
                                float* __restrict__ xs) {
  pdl_wait();
  pdl_release();
  const int64_t block = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (block >= blocks) return;
  const int lane = threadIdx.x % 32;
  const float v = x[32 * block + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  const int q = max(-127, min(127, __float2int_rn(v * inv)));
  int sum = q;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const int t = lane % 8;
  xq[32 * block + (lane - t) + 4 * (t % 2) + t / 2] = int8_t(q);
  if (lane == 0) {
    xd[block] = d;
    xs[block] = d * float(sum);
  }
}

template <int kUnits, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    gemv_affine4_kernel(const WeightArgs w, const int8_t* __restrict__ xq,
                        const float* __restrict__ xd, const float* __restrict__ xs,
                        float* __restrict__ y) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  if (row0 >= w.rows) {
    pdl_wait();
    return;
  }
  int64_t row[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) row[r] = min(row0 + r, w.rows - 1);
  const int64_t units = w.cols / 32;
  const uint4* codes_row[kRowsPerWarp];
  const unsigned short* scales_row[kRowsPerWarp];
  const unsigned short* biases_row[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    codes_row[r] = reinterpret_cast<const uint4*>(w.data + row[r] * w.row_bytes);
    scales_row[r] = reinterpret_cast<const unsigned short*>(w.scales) + row[r] * w.groups;
    biases_row[r] = reinterpret_cast<const unsigned short*>(w.biases) + row[r] * w.groups;
  }
  float acc[kRowsPerWarp] = {};
  for (int64_t u0 = lane; u0 < units; u0 += 32 * kUnits) {
    uint4 codes[kUnits][kRowsPerWarp];
    uint32_t s[kUnits][kRowsPerWarp], b[kUnits][kRowsPerWarp];
    uint4 xa[kUnits], xb[kUnits];
    float d[kUnits], sx[kUnits];
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const int64_t u = u0 + 32 * j;
      if (u < units) {
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          codes[j][r] = __ldg(codes_row[r] + u);
          s[j][r] = __ldg(scales_row[r] + (u >> w.group_shift));
          b[j][r] = __ldg(biases_row[r] + (u >> w.group_shift));
        }
      }
    }
    // The weights are never written by a kernel, so their loads may start before the
    // kernels this one depends on (the quantization of x) have finished.
    pdl_wait();
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const int64_t u = u0 + 32 * j;
      if (u < units) {
        const uint4* xp = reinterpret_cast<const uint4*>(xq + 32 * u);
        xa[j] = __ldg(xp);
        xb[j] = __ldg(xp + 1);
        d[j] = __ldg(xd + u);
        sx[j] = __ldg(xs + u);
      }
    }
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      if (u0 + 32 * j < units) {
        const int xw[8] = {int(xa[j].x), int(xa[j].y), int(xa[j].z), int(xa[j].w),
                           int(xb[j].x), int(xb[j].y), int(xb[j].z), int(xb[j].w)};
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const uint32_t cw[4] = {codes[j][r].x, codes[j][r].y, codes[j][r].z, codes[j][r].w};
          int dot = 0;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            dot = __dp4a(int(cw[k] & 0x0F0F0F0Fu), xw[2 * k], dot);
            dot = __dp4a(int((cw[k] >> 4) & 0x0F0F0F0Fu), xw[2 * k + 1], dot);
          }
          const float scale = scale_value(s[j][r], w.scales_bf16);
          const float bias = scale_value(b[j][r], w.scales_bf16);
          acc[r] = fmaf(scale * d[j], float(dot), fmaf(bias, sx[j], acc[r]));
        }
      }
    }
  }
  pdl_wait();  // lanes without a unit of their own still write y below
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float v = acc[r];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && row0 + r < w.rows) y[row0 + r] = v;
  }
  pdl_release();
}

}  // namespace

int64_t gemv_int8_workspace_bytes(int64_t cols) {
  return (cols + 15) / 16 * 16 + 2 * 4 * (cols / 32) + 16;
}

void launch_gemv_affine4_int8(const WeightArgs& w, const float* x, float* y, uint8_t* workspace,
                              Int8GemvShape shape, cudaStream_t stream) {
  const int64_t blocks = w.cols / 32;
  int8_t* xq = reinterpret_cast<int8_t*>(workspace);
  float* xd = reinterpret_cast<float*>(workspace + (w.cols + 15) / 16 * 16);
  float* xs = xd + blocks;
  launch_pdl(quantize_kernel, dim3(unsigned((blocks + kWarps - 1) / kWarps)), dim3(kWarps * 32),
             0, stream, x, blocks, xq, xd, xs);
  const int64_t grid = (w.rows + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp);
  using Kernel = void (*)(const WeightArgs, const int8_t*, const float*, const float*, float*);
  Kernel kernel = gemv_affine4_kernel<4, 2>;
  if (shape == Int8GemvShape::kUnits2Blocks3) kernel = gemv_affine4_kernel<2, 3>;
  launch_pdl(kernel, dim3(unsigned(grid)), dim3(kWarps * 32), 0, stream, w,
             static_cast<const int8_t*>(xq), static_cast<const float*>(xd),
             static_cast<const float*>(xs), y);
}

}  // namespace turbokv::cuda::qmm
