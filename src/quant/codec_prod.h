// The Prod (QJL) codec (docs/design.md, "TurboQuant"): an unbiased inner-product estimator, not the
// default (higher variance than the MSE codec, which softmax amplifies).
//
// x -> n = ‖x‖, u = x / n, y = R u (as the MSE codec, codec_mse.h steps 1-3);
// b-1 bit MSE codes ĉ of y (none for b = 1, ĉ = 0); residual in the rotated frame
// r = y - ĉ (‖r‖ = ‖u - Rᵀĉ‖ since R is orthogonal); QJL signs σ = sign(S r) (σ_i = +1 when
// (S r)_i >= 0), S a d×d standard Gaussian matrix from (seed, d, RotationRole::kQjl), row-major,
// the i-th gaussian() of that stream is S[i / d][i % d]. Applying S to the rotated residual
// is the same as applying the (equally Gaussian) S·R to u - û: the estimator is unchanged.
// Estimator: <q, x> ≈ n · (<Rq, ĉ> + √(π/2)/d · ‖r‖ · <S R q, σ>).
// Storage: codes = [(b-1)-bit MSE codes | d sign bits (1 = +1)], LSB-first (bitpack.h);
// norms = [fp16 n, fp16 ‖r‖]. Scalar only.
#pragma once

#include <memory>
#include <vector>

#include "quant/bitpack.h"
#include "quant/codebook.h"
#include "quant/rotation.h"

namespace turbokv::quant {

struct ProdCodecConfig {
  int dim = 0;
  int bits = 0;  // 1..8 in total per element (b-1 MSE + 1 QJL)
  uint64_t seed = 0;
  RotationRole role = RotationRole::kKey;
};

class ProdCodec {
 public:
  // Throws InvalidArgument for dim < 2 or bits outside 1..8.
  explicit ProdCodec(const ProdCodecConfig& config);

  int dim() const { return dim_; }
  int bits() const { return bits_; }
  size_t mse_code_bytes() const {
    return bits_ > 1 ? PackedLayout{dim_, bits_ - 1}.code_bytes() : 0;
  }
  size_t code_bytes() const { return mse_code_bytes() + PackedLayout{dim_, 1}.code_bytes(); }
  static constexpr int kNormsPerVector = 2;
  const Rotation& rotation() const { return *rotation_; }
  const std::vector<float>& qjl_matrix() const { return qjl_; }  // [dim, dim] S, row-major

  // x [dim] -> codes [code_bytes], norms [2].
  void quantize(const float* x, uint8_t* codes, uint16_t* norms) const;
  // The unbiased reconstruction n · Rᵀ(ĉ + √(π/2)/d · ‖r‖ · Sᵀσ).
  void dequantize(const uint8_t* codes, const uint16_t* norms, float* x) const;
  // Batches: x [n, dim] -> codes [n, code_bytes], norms [n, 2]; multi-threaded.
  void quantize_batch(const float* x, int64_t n, uint8_t* codes, uint16_t* norms) const;

  // prepared [2 * dim] = [R q | S R q], the query side of the estimator.
  void prepare_query(const float* q, float* prepared) const;
  // scores [n]: the estimator of <q, x_t> for each coded vector.
  void score(const float* prepared, const uint8_t* codes, const uint16_t* norms, int64_t n,
             float* scores) const;

 private:
  int dim_, bits_;
  std::shared_ptr<const Rotation> rotation_;
  const Codebook* codebook_;  // bits - 1 bits; nullptr for bits == 1
  std::vector<float> qjl_;    // [dim, dim]
};

}  // namespace turbokv::quant
