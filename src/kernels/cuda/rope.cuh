// Rotate-half RoPE of one pair on the device, with every rounding explicit: qkv_post and the
// fused RoPE + quantize kernel (tq_quantize.h), which is compiled without FMA contraction, give
// the same bits.
#pragma once

namespace turbokv::cuda {

// (a, b) = (x_i, x_{i + rotary_dim / 2}) rotated by angle float(position) * inv_freq_i, cos and
// sin (in double) times attention_scaling.
// The pair's cos and sin (times attention_scaling) ...
__device__ __forceinline__ void rope_cos_sin(float position, float inv_freq, float scaling,
                                             float* c, float* s) {
  const float angle = __fmul_rn(position, inv_freq);
  *c = __fmul_rn(float(cos(double(angle))), scaling);
  *s = __fmul_rn(float(sin(double(angle))), scaling);
}
// ... and the rotation by them.
__device__ __forceinline__ void rope_rotate(float a, float b, float c, float s, float* ra,
                                            float* rb) {
  *ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  *rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}
__device__ __forceinline__ void rope_pair(float position, float inv_freq, float scaling, float a,
                                          float b, float* ra, float* rb) {
  float c, s;
  rope_cos_sin(position, inv_freq, scaling, &c, &s);
  rope_rotate(a, b, c, s, ra, rb);
}

}  // namespace turbokv::cuda
