// MSE codec: scalar reference of every step (order documented in codec_mse.h) and dispatch
// to the AVX2 kernels.
#include "quant/codec_mse.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"

namespace turbokv::quant {

float sum_squares_ref(const float* x, int n) {
  float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    const float square = x[i] * x[i];
    p[i % 8] = p[i % 8] + square;
  }
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

float dot_ref(const float* a, const float* b, int n) {
  float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    const float product = a[i] * b[i];
    p[i % 8] = p[i % 8] + product;
  }
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

MseCodec::MseCodec(const MseCodecConfig& config)
    : layout_(make_packed_layout(config.dim, config.bits)),
      norm_correction_(config.norm_correction),
      unbiased_norm_(config.unbiased_norm) {
  codebook_ = &lloyd_max_codebook(config.dim, config.bits);  // validates dim >= 2
  rotation_ = Rotation::get(config.seed, config.dim, config.role);
}

void MseCodec::quantize(const float* x, uint8_t* codes, uint16_t* norms, Isa isa) const {
  if (usable_isa(isa) == Isa::kAvx2) {
    avx2::mse_quantize(*this, x, codes, norms);
    return;
  }
  const int d = dim();
  thread_local std::vector<float> scratch;
  scratch.resize(2 * size_t(d));
  float* u = scratch.data();      // [d]
  float* y = scratch.data() + d;  // [d]
  const float n = std::sqrt(sum_squares_ref(x, d));
  const float inv = 1.0f / std::fmax(n, 1e-6f);
  for (int i = 0; i < d; ++i) u[i] = x[i] * inv;
  rotation_->apply(u, y, Isa::kScalar);
  thread_local std::vector<uint8_t> idx;
  thread_local std::vector<float> c;
  idx.resize(d);
  c.resize(d);
  for (int i = 0; i < d; ++i) {
    idx[i] = uint8_t(nearest_centroid(*codebook_, y[i]));
    c[i] = codebook_->centroids[idx[i]];
  }
  float stored = n;
  if (unbiased_norm_) {
    const float p = dot_ref(y, c.data(), d);
    if (p > 0) stored = n / p;
  } else if (norm_correction_) {
    const float cn = std::sqrt(sum_squares_ref(c.data(), d));
    if (cn > 0) stored = n / cn;
  }
  norms[0] = f32_to_f16(stored);
  pack_codes(idx.data(), d, layout_.bits, codes);
}

void MseCodec::decode_rotated(const uint8_t* codes, uint16_t norm, float* y) const {
  const float n = f16_to_f32(norm);
  for (int i = 0; i < dim(); ++i) {
    y[i] = codebook_->centroids[packed_code_at(codes, layout_.bits, i)] * n;
  }
}

void MseCodec::dequantize(const uint8_t* codes, const uint16_t* norms, float* x) const {
  thread_local std::vector<float> y;
  y.resize(dim());
  decode_rotated(codes, norms[0], y.data());
  rotation_->apply_transpose(y.data(), x, Isa::kScalar);
}

void MseCodec::rotate_query(const float* q, float* rq, Isa isa) const {
  rotation_->apply(q, rq, isa);
}

void MseCodec::unrotate(const float* acc, float* out, Isa isa) const {
  rotation_->apply_transpose(acc, out, isa);
}

void MseCodec::score_multi(const float* rq, int n_queries, const uint8_t* codes,
                           const uint16_t* norms, int64_t n, float* scores, Isa isa) const {
  score_rows(QueryRows{rq, n_queries, size_t(dim())}, CodeRows{codes, code_bytes(), norms, 1}, n,
             scores, false, isa);
}

void MseCodec::accumulate_multi(const float* weights, int n_queries, const uint8_t* codes,
                                const uint16_t* norms, int64_t n, float* acc, Isa isa) const {
  accumulate_rows(QueryRows{weights, n_queries, size_t(n)}, CodeRows{codes, code_bytes(), norms, 1},
                  n, acc, size_t(dim()), isa);
}

void MseCodec::score_rows(const QueryRows& queries, const CodeRows& rows, int64_t n, float* scores,
                          bool add, Isa isa) const {
  if (usable_isa(isa) == Isa::kAvx2) {
    avx2::mse_score(*this, queries, rows, n, scores, add);
    return;
  }
  const int d = dim();
  const float* c = codebook_->centroids.data();
  for (int j = 0; j < queries.count; ++j) {
    const float* rq = queries.data + j * queries.stride;
    float* out = scores + j * n;
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* row = rows.codes + t * rows.code_stride;
      float dot = 0;
      for (int i = 0; i < d; ++i) dot += rq[i] * c[packed_code_at(row, layout_.bits, i)];
      const float s = dot * f16_to_f32(rows.norms[t * rows.norm_stride]);
      out[t] = add ? out[t] + s : s;
    }
  }
}

void MseCodec::accumulate_rows(const QueryRows& weights, const CodeRows& rows, int64_t n,
                               float* acc, size_t acc_stride, Isa isa) const {
  if (usable_isa(isa) == Isa::kAvx2) {
    avx2::mse_accumulate(*this, weights, rows, n, acc, acc_stride);
    return;
  }
  const int d = dim();
  const float* c = codebook_->centroids.data();
  for (int j = 0; j < weights.count; ++j) {
    const float* w = weights.data + j * weights.stride;
    float* out = acc + j * acc_stride;
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* row = rows.codes + t * rows.code_stride;
      const float coef = w[t] * f16_to_f32(rows.norms[t * rows.norm_stride]);
      for (int i = 0; i < d; ++i) out[i] += coef * c[packed_code_at(row, layout_.bits, i)];
    }
  }
}

}  // namespace turbokv::quant
