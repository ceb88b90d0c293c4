// The TurboQuant MSE codec (docs/design.md, "TurboQuant"): x -> (fp16 norm, b-bit Lloyd-Max codes
// of R x/|x|).
//
// ===== Exact operation order of quantize() (scalar == AVX2 == CUDA, bit for bit) =====
// All float32, every product rounded before it is added (no FMA; the build has
// -ffp-contract=off), d = dim, C = codebook centroids, B = boundaries (codebook.h).
//  1. Sum of squares in 8 interleaved partial sums: p[0..7] = +0; for i = 0..d-1 ascending:
//     p[i % 8] = p[i % 8] + x_i*x_i. Then
//     sumsq = ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)).
//     n = sqrtf(sumsq) (correctly rounded IEEE sqrt).
//  2. inv = 1.0f / fmaxf(n, 1e-6f);  u_i = x_i * inv.
//  3. y = R u in the order of rotation.h (Hadamard: sign flip, butterflies h = 1, 2, ..., d/2,
//     then * float(1/sqrt(d)); dense: sequential dot products, j ascending).
//  4. idx_i = #{k : B[k] < y_i} (strict; NaN -> 0).
//  5. Norm correction on: cs = Σ C[idx_i]² with the same 8 partial sums and tree as step 1,
//     cn = sqrtf(cs), stored = cn > 0 ? n / cn : n (float division). Off: stored = n.
//     Unbiased norm (overrides both): p = Σ y_i*C[idx_i] (same partial sums and tree),
//     stored = p > 0 ? n / p : n. Then <q, dequantize(x)> = <q, x> + n/p <R q, C - p y>: the
//     decoded vector's component along x is exactly x, the rest is the code's error orthogonal
//     to y (p > 0 whenever y != 0: every y_i*C[idx_i] >= 0, the codebook being symmetric).
//     norm = f32_to_f16(stored) (round to nearest even, core/half.h).
//  6. Codes packed LSB-first (bitpack.h): code i at bits [i*b, (i+1)*b) of the code bytes.
// dequantize(): y_i = C[idx_i] * f16_to_f32(norm); x = R^T y (rotation.h order).
// score() / accumulate() (and the _multi forms) are not bit-exact across paths (they may use FMA);
// they agree with the scalar reference within float rounding.
#pragma once

#include <memory>

#include "quant/bitpack.h"
#include "quant/codebook.h"
#include "quant/codec.h"
#include "quant/rotation.h"

namespace turbokv::quant {

// Row t's codes at codes + t * code_stride, its norm at norms[t * norm_stride].
struct CodeRows {
  const uint8_t* codes = nullptr;
  size_t code_stride = 0;
  const uint16_t* norms = nullptr;
  size_t norm_stride = 1;
};

// count rows of floats, row j at data + j * stride (rotated queries, or weight rows).
struct QueryRows {
  const float* data = nullptr;
  int count = 1;
  size_t stride = 0;
};

struct MseCodecConfig {
  int dim = 0;
  int bits = 0;  // 1..8
  uint64_t seed = 0;
  RotationRole role = RotationRole::kKey;
  bool norm_correction = true;
  bool unbiased_norm = false;  // step 5: stored = n / <y, C[idx]> (overrides norm_correction)
};

class MseCodec final : public TurboQuantCodec {
 public:
  // Throws InvalidArgument for dim < 2 or bits outside 1..8.
  explicit MseCodec(const MseCodecConfig& config);

  int dim() const override { return layout_.dim; }
  double bits() const override { return layout_.bits; }
  int int_bits() const { return layout_.bits; }
  size_t code_bytes() const override { return layout_.code_bytes(); }
  int norms_per_vector() const override { return 1; }
  const PackedLayout& layout() const { return layout_; }
  const Rotation& rotation() const { return *rotation_; }
  const Codebook& codebook() const { return *codebook_; }
  bool norm_correction() const { return norm_correction_; }
  bool unbiased_norm() const { return unbiased_norm_; }

  void quantize(const float* x, uint8_t* codes, uint16_t* norms,
                Isa isa = best_isa()) const override;
  void dequantize(const uint8_t* codes, const uint16_t* norms, float* x) const override;
  void rotate_query(const float* q, float* rq, Isa isa = best_isa()) const override;
  void score_multi(const float* rq, int n_queries, const uint8_t* codes, const uint16_t* norms,
                   int64_t n, float* scores, Isa isa = best_isa()) const override;
  void accumulate_multi(const float* weights, int n_queries, const uint8_t* codes,
                        const uint16_t* norms, int64_t n, float* acc,
                        Isa isa = best_isa()) const override;
  void unrotate(const float* acc, float* out, Isa isa = best_isa()) const override;

  // y [dim] = norm · C[idx]: the vector in the rotated frame (what dequantize rotates back).
  void decode_rotated(const uint8_t* codes, uint16_t norm, float* y) const;

  // score / accumulate with strides (the split codec keeps two codecs' codes and norms
  // interleaved in one record, and its rotated frame holds both halves).
  // scores [queries.count, n] (row stride n); add = true adds to scores.
  void score_rows(const QueryRows& queries, const CodeRows& rows, int64_t n, float* scores,
                  bool add, Isa isa = best_isa()) const;
  // weights: queries.count rows of n weights; acc row j at acc + j * acc_stride.
  void accumulate_rows(const QueryRows& weights, const CodeRows& rows, int64_t n, float* acc,
                       size_t acc_stride, Isa isa = best_isa()) const;

 private:
  PackedLayout layout_;
  bool norm_correction_;
  bool unbiased_norm_;
  std::shared_ptr<const Rotation> rotation_;
  const Codebook* codebook_;
};

// Sum of squares in the documented order (8 interleaved partial sums, fixed tree).
float sum_squares_ref(const float* x, int n);
// Σ a_i*b_i in the same order.
float dot_ref(const float* a, const float* b, int n);

namespace avx2 {
void mse_quantize(const MseCodec& codec, const float* x, uint8_t* codes, uint16_t* norm);
void mse_score(const MseCodec& codec, const QueryRows& queries, const CodeRows& rows, int64_t n,
               float* scores, bool add);
void mse_accumulate(const MseCodec& codec, const QueryRows& weights, const CodeRows& rows,
                    int64_t n, float* acc, size_t acc_stride);
}  // namespace avx2

}  // namespace turbokv::quant
