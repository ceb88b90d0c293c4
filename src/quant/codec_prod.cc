// Prod (QJL) codec, scalar: MSE codes of the rotated unit vector plus 1-bit signs of a
// Gaussian projection of the residual (layout and estimator in codec_prod.h).
#include "quant/codec_prod.h"

#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "core/rng.h"
#include "core/threads.h"
#include "quant/codec_mse.h"

namespace turbokv::quant {
namespace {

constexpr double kSqrtHalfPi = 1.2533141373155003;

}  // namespace

ProdCodec::ProdCodec(const ProdCodecConfig& config) : dim_(config.dim), bits_(config.bits) {
  if (bits_ < 1 || bits_ > 8) {
    throw InvalidArgument(str_cat("prod codec bits ", bits_, " is invalid: allowed 1..8"));
  }
  if (dim_ < 2)
    throw InvalidArgument(str_cat("prod codec dimension ", dim_, " is invalid: need d >= 2"));
  codebook_ = bits_ > 1 ? &lloyd_max_codebook(dim_, bits_ - 1) : nullptr;
  rotation_ = Rotation::get(config.seed, dim_, config.role);
  Xoshiro256 rng(derive_seed(config.seed, uint64_t(dim_), uint64_t(RotationRole::kQjl)));
  qjl_.resize(size_t(dim_) * dim_);
  for (auto& v : qjl_) v = float(rng.gaussian());
}

void ProdCodec::quantize(const float* x, uint8_t* codes, uint16_t* norms) const {
  const int d = dim_;
  std::vector<float> u(d), y(d);
  std::vector<uint8_t> idx(d), signs(d);
  const float n = std::sqrt(sum_squares_ref(x, d));
  const float inv = 1.0f / std::fmax(n, 1e-6f);
  for (int i = 0; i < d; ++i) u[i] = x[i] * inv;
  rotation_->apply(u.data(), y.data(), Isa::kScalar);
  for (int i = 0; i < d; ++i) {  // y becomes the residual r = y - ĉ
    if (codebook_ != nullptr) {
      idx[i] = uint8_t(nearest_centroid(*codebook_, y[i]));
      y[i] = y[i] - codebook_->centroids[idx[i]];
    }
  }
  const float residual_norm = std::sqrt(sum_squares_ref(y.data(), d));
  for (int i = 0; i < d; ++i) {
    const float* row = qjl_.data() + size_t(i) * d;
    double projection = 0;
    for (int j = 0; j < d; ++j) projection += double(row[j]) * y[j];
    signs[i] = projection >= 0 ? 1 : 0;
  }
  if (codebook_ != nullptr) pack_codes(idx.data(), d, bits_ - 1, codes);
  pack_codes(signs.data(), d, 1, codes + mse_code_bytes());
  norms[0] = f32_to_f16(n);
  norms[1] = f32_to_f16(residual_norm);
}

void ProdCodec::dequantize(const uint8_t* codes, const uint16_t* norms, float* x) const {
  const int d = dim_;
  const float n = f16_to_f32(norms[0]);
  const double qjl_scale = kSqrtHalfPi / d * f16_to_f32(norms[1]);
  const uint8_t* sign_bits = codes + mse_code_bytes();
  std::vector<double> rotated(d, 0.0);  // ĉ + qjl_scale · Sᵀσ
  for (int i = 0; i < d; ++i) {
    const double sigma = packed_code_at(sign_bits, 1, i) ? 1.0 : -1.0;
    const float* row = qjl_.data() + size_t(i) * d;
    for (int j = 0; j < d; ++j) rotated[j] += qjl_scale * sigma * row[j];
  }
  std::vector<float> y(d);
  for (int j = 0; j < d; ++j) {
    const double c = codebook_ ? codebook_->centroids[packed_code_at(codes, bits_ - 1, j)] : 0.0;
    y[j] = float(n * (c + rotated[j]));
  }
  rotation_->apply_transpose(y.data(), x, Isa::kScalar);
}

void ProdCodec::quantize_batch(const float* x, int64_t n, uint8_t* codes, uint16_t* norms) const {
  parallel_for(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      quantize(x + t * dim_, codes + t * code_bytes(), norms + t * kNormsPerVector);
    }
  });
}

void ProdCodec::prepare_query(const float* q, float* prepared) const {
  const int d = dim_;
  rotation_->apply(q, prepared, Isa::kScalar);
  for (int i = 0; i < d; ++i) {
    const float* row = qjl_.data() + size_t(i) * d;
    double projection = 0;
    for (int j = 0; j < d; ++j) projection += double(row[j]) * prepared[j];
    prepared[d + i] = float(projection);
  }
}

void ProdCodec::score(const float* prepared, const uint8_t* codes, const uint16_t* norms, int64_t n,
                      float* scores) const {
  const int d = dim_;
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = codes + t * code_bytes();
    const uint16_t* row_norms = norms + t * kNormsPerVector;
    double mse_part = 0, qjl_part = 0;
    for (int i = 0; i < d; ++i) {
      if (codebook_ != nullptr) {
        mse_part += double(prepared[i]) * codebook_->centroids[packed_code_at(row, bits_ - 1, i)];
      }
      const bool positive = packed_code_at(row + mse_code_bytes(), 1, i) != 0;
      qjl_part += positive ? prepared[d + i] : -prepared[d + i];
    }
    const double residual_norm = f16_to_f32(row_norms[1]);
    scores[t] =
        float(f16_to_f32(row_norms[0]) * (mse_part + kSqrtHalfPi / d * residual_norm * qjl_part));
  }
}

}  // namespace turbokv::quant
