// Rotate-half RoPE of one pair on the device, with every rounding explicit: qkv_post and the
// fused RoPE + quantize kernel (tq_quantize.h), which is compiled without FMA contraction, give
// the same bits.
#pragma once

namespace turbokv::cuda {

// (a, b) = (x_i, x_{i + rotary_dim / 2}) rotated by angle float(position) * inv_freq_i, cos and
// sin (in double) times attention_scaling.
__device__ __forceinline__ void rope_pair(float position, float inv_freq, float scaling, float a,
                                          float b, float* ra, float* rb) {
  const float angle = __fmul_rn(position, inv_freq);
  const float c = __fmul_rn(float(cos(double(angle))), scaling);
  const float s = __fmul_rn(float(sin(double(angle))), scaling);
  *ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  *rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

}  // namespace turbokv::cuda
