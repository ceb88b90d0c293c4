// Device building blocks of the quantize kernels that must equal the CPU codecs bit for bit
// (quant/codec_mse.h, quant/rotation.h, core/half.h). Every float operation here is an
// explicit round-to-nearest intrinsic, and the files that use them are compiled with
// -fmad=false, so no product is fused into an add behind our back.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace turbokv::cuda {

// core/half.h f32_to_f16: IEEE round to nearest even; NaN -> sign | 0x7e00.
__device__ __forceinline__ uint16_t to_f16_bits(float x) {
  if (isnan(x)) return uint16_t(((__float_as_uint(x) >> 16) & 0x8000u) | 0x7e00u);
  return __half_as_ushort(__float2half_rn(x));
}

// core/half.h f32_to_bf16: round to nearest even; NaN -> its top half | 0x40 (quiet).
__device__ __forceinline__ uint16_t to_bf16_bits(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Σ squares[i], i < n, in the order of quant/codec_mse.h: 8 interleaved partial sums
// (i ascending), then ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)). Warp-collective:
// every lane passes the same shared array, written and __syncwarp()ed before the call, and
// gets the sum; the array may be overwritten once the call returns.
__device__ __forceinline__ float ordered_sum(const float* squares, int n, int lane) {
  float p = 0.0f;
  if (lane < 8) {
    for (int i = lane; i < n; i += 8) p = __fadd_rn(p, squares[i]);
  }
  float part[8];
  for (int k = 0; k < 8; ++k) part[k] = __shfl_sync(0xffffffffu, p, k);
  __syncwarp();
  return __fadd_rn(__fadd_rn(__fadd_rn(part[0], part[4]), __fadd_rn(part[2], part[6])),
                   __fadd_rn(__fadd_rn(part[1], part[5]), __fadd_rn(part[3], part[7])));
}

// In-place Walsh-Hadamard butterflies of quant/rotation.h on a shared array of `dim` floats
// (a power of two): for h = 1, 2, ..., dim / 2, every pair (j, j + h) with (j & h) == 0
// becomes (a + b, a - b). Warp-collective; a must be __syncwarp()ed before the call and is
// again after it.
__device__ __forceinline__ void fwht_warp(float* a, int dim, int lane) {
  for (int h = 1; h < dim; h *= 2) {
    for (int p = lane; p < dim / 2; p += 32) {
      const int j = (p / h) * 2 * h + p % h;
      const float x = a[j], y = a[j + h];
      a[j] = __fadd_rn(x, y);
      a[j + h] = __fsub_rn(x, y);
    }
    __syncwarp();
  }
}

// Sign bit i of a segment's flip mask (quant/rotation.h: channel i flips).
__device__ __forceinline__ bool sign_flip_at(const uint32_t* words, int i) {
  return (words[i / 32] >> (i % 32)) & 1u;
}

}  // namespace turbokv::cuda
