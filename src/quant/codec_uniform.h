// Uniform affine group codec (docs/design.md, "Uniform scheme"; the mlx-style baseline): each group
// of group_size consecutive elements (the last group may be shorter) is stored as b-bit
// integers q with an fp16 scale and min: x̂ = scale * q + min.
//
// Exact operation order of quantize() (scalar == AVX2 == CUDA), per group:
//  mn = min(x), mx = max(x); mn = mn + 0.0f, mx = mx + 0.0f (so -0 becomes +0);
//  (inputs must be finite; NaN handling is not specified across paths)
//  scale = (mx - mn) / float(2^b - 1); params = {f32_to_f16(scale), f32_to_f16(mn)};
//  s = f16_to_f32(params.scale), m = f16_to_f32(params.min), inv = s > 0 ? 1.0f / s : 0;
//  q_i = min(max(floorf((x_i - m) * inv + 0.5f), 0), 2^b - 1)   (NaN -> 0).
// Codes are packed LSB-first over the whole vector (bitpack.h).
// Storage: codes [n, code_bytes()], params [n, groups(), 2] fp16 bits (scale, min).
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/bitpack.h"
#include "quant/isa.h"

namespace turbokv::quant {

struct UniformCodecConfig {
  int dim = 0;
  int bits = 0;         // 2..8
  int group_size = 64;  // 32, 64 or 128
};

class UniformCodec {
 public:
  // Throws InvalidArgument for dim < 1, bits outside 2..8, group_size not 32/64/128.
  explicit UniformCodec(const UniformCodecConfig& config);

  int dim() const { return layout_.dim; }
  int bits() const { return layout_.bits; }
  int group_size() const { return group_size_; }
  int groups() const { return (layout_.dim + group_size_ - 1) / group_size_; }
  size_t code_bytes() const { return layout_.code_bytes(); }
  int params_per_vector() const { return 2 * groups(); }
  size_t bytes_per_vector() const { return code_bytes() + 2 * size_t(params_per_vector()); }

  // x [dim] -> codes [code_bytes], params [groups, 2].
  void quantize(const float* x, uint8_t* codes, uint16_t* params, Isa isa = best_isa()) const;
  void dequantize(const uint8_t* codes, const uint16_t* params, float* x) const;
  // Batches of n vectors, multi-threaded; identical to per-vector calls.
  void quantize_batch(const float* x, int64_t n, uint8_t* codes, uint16_t* params,
                      Isa isa = best_isa()) const;
  void dequantize_batch(const uint8_t* codes, const uint16_t* params, int64_t n, float* x) const;

  // Attention primitives (no rotation: the frame is the input frame).
  // scores [n]: <q, dequantize(t)>.
  void score(const float* q, const uint8_t* codes, const uint16_t* params, int64_t n, float* scores,
             Isa isa = best_isa()) const;
  // acc [dim] += Σ_t weights[t] · dequantize(t).
  void accumulate(const float* weights, const uint8_t* codes, const uint16_t* params, int64_t n,
                  float* acc, Isa isa = best_isa()) const;

 private:
  PackedLayout layout_;
  int group_size_;
};

// The scalar steps of quantize() that the scalar and AVX2 paths share (order above).
struct UniformGroupScale {
  float min = 0;        // f16_to_f32(params.min)
  float inv_scale = 0;  // 1 / f16_to_f32(params.scale), 0 for a constant group
  float top = 0;        // 2^b - 1
};
// A group's min mn and max mx (±0 canonicalized here) -> params [2] = {scale, min} fp16 bits;
// returns what its codes are computed with.
UniformGroupScale uniform_group_params(float mn, float mx, int bits, uint16_t* params);
// q[i] for i in [begin, end): the codes of x[i] in a group with that scale.
void uniform_group_codes(const float* x, int begin, int end, const UniformGroupScale& scale,
                         uint8_t* q);

namespace avx2 {
void uniform_quantize(const UniformCodec& codec, const float* x, uint8_t* codes, uint16_t* params);
void uniform_score(const UniformCodec& codec, const float* q, const uint8_t* codes,
                   const uint16_t* params, int64_t n, float* scores);
void uniform_accumulate(const UniformCodec& codec, const float* weights, const uint8_t* codes,
                        const uint16_t* params, int64_t n, float* acc);
}  // namespace avx2

}  // namespace turbokv::quant
