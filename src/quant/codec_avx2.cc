// AVX2 kernels of the TurboQuant codecs: FWHT, dense rotation, MSE quantize/score/accumulate. Only entered after cpu_has_avx2(). Quantize paths follow the
// operation order documented in codec_mse.h / rotation.h exactly (no FMA),
// so their codes equal the scalar reference bit for bit; score/accumulate use FMA.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "quant/codec_mse.h"
#include "quant/avx2_util.h"
#include "quant/rotation.h"

namespace turbokv::quant::avx2 {
namespace {

// Centroid lookup tables for B bits: registers for B <= 4, a gather otherwise.
template <int B>
struct CentroidTable {
  explicit CentroidTable(const float* centroids) : data(centroids) {
    float padded[16] = {};
    std::memcpy(padded, centroids, sizeof(float) * std::min(16, 1 << B));
    low = _mm256_loadu_ps(padded);
    high = _mm256_loadu_ps(padded + 8);
  }
  __m256 lookup(__m256i idx) const {
    if constexpr (B <= 3) {
      return _mm256_permutevar8x32_ps(low, idx);
    } else if constexpr (B == 4) {
      return _mm256_blendv_ps(_mm256_permutevar8x32_ps(low, idx),
                              _mm256_permutevar8x32_ps(high, idx),
                              _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
    } else {
      return _mm256_i32gather_ps(data, idx, 4);
    }
  }
  const float* data;
  __m256 low, high;
};

// #{k : boundaries[k] < y} per lane (NaN -> 0), identical to nearest_centroid().
template <int B>
inline __m256i nearest8(__m256 y, const float* boundaries) {
  if constexpr (B <= 4) {
    __m256i count = _mm256_setzero_si256();
    for (int k = 0; k < (1 << B) - 1; ++k) {
      const __m256 below = _mm256_cmp_ps(y, _mm256_set1_ps(boundaries[k]), _CMP_GT_OQ);
      count = _mm256_sub_epi32(count, _mm256_castps_si256(below));
    }
    return count;
  } else {
    __m256i lo = _mm256_setzero_si256();
    for (int step = 1 << (B - 1); step >= 1; step /= 2) {
      const __m256i probe = _mm256_add_epi32(lo, _mm256_set1_epi32(step - 1));
      const __m256 value = _mm256_i32gather_ps(boundaries, probe, 4);
      const __m256i take = _mm256_castps_si256(_mm256_cmp_ps(y, value, _CMP_GT_OQ));
      lo = _mm256_add_epi32(lo, _mm256_and_si256(take, _mm256_set1_epi32(step)));
    }
    return lo;
  }
}

// OR of the 8 lanes after shifting code j left by j*B: the packed bits of one group (B <= 4).
template <int B>
inline uint32_t pack8(__m256i idx) {
  const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
  const __m256i shifted = _mm256_sllv_epi32(idx, shifts);
  __m128i v = _mm_or_si128(_mm256_castsi256_si128(shifted), _mm256_extracti128_si256(shifted, 1));
  v = _mm_or_si128(v, _mm_shuffle_epi32(v, 0x4E));
  v = _mm_or_si128(v, _mm_shuffle_epi32(v, 0xB1));
  return uint32_t(_mm_cvtsi128_si32(v));
}

struct Scratch {
  std::vector<float> values;  // [dim rounded up to 8]
  std::vector<float> rotated;  // [dim rounded up to 8]
  std::vector<int32_t> idx;   // [dim rounded up to 8]
  std::vector<uint8_t> codes;  // [dim rounded up to 8]
};

Scratch& scratch(int padded_dim) {
  thread_local Scratch s;
  if (int(s.values.size()) < padded_dim) {
    s.values.resize(padded_dim);
    s.rotated.resize(padded_dim);
    s.idx.resize(padded_dim);
    s.codes.resize(padded_dim);
  }
  return s;
}

template <int B>
void mse_quantize_bits(const MseCodec& codec, const float* x, uint8_t* codes, uint16_t* norm) {
  const int d = codec.dim();
  const int padded = (d + 7) / 8 * 8;
  Scratch& s = scratch(padded);
  float* u = s.values.data();   // [padded]
  float* y = s.rotated.data();  // [padded]
  std::memcpy(u, x, sizeof(float) * d);
  std::fill(u + d, u + padded, 0.0f);

  __m256 partial = _mm256_setzero_ps();
  for (int i = 0; i < padded; i += 8) {
    const __m256 v = _mm256_loadu_ps(u + i);
    partial = _mm256_add_ps(partial, _mm256_mul_ps(v, v));
  }
  const float n = std::sqrt(reduce_tree(partial));
  const __m256 inv = _mm256_set1_ps(1.0f / std::fmax(n, 1e-6f));
  for (int i = 0; i < padded; i += 8) _mm256_storeu_ps(u + i, _mm256_mul_ps(_mm256_loadu_ps(u + i), inv));

  codec.rotation().apply(u, y, Isa::kAvx2);
  std::fill(y + d, y + padded, 0.0f);

  const Codebook& book = codec.codebook();
  const CentroidTable<B> table(book.centroids.data());
  __m256 c_partial = _mm256_setzero_ps();
  for (int i = 0; i < padded; i += 8) {
    __m256i idx = nearest8<B>(_mm256_loadu_ps(y + i), book.boundaries.data());
    if (i + 8 > d) {  // zero the padding lanes: no centroid energy, no stray code bits
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(d - i), lane);
      __m256 c = _mm256_and_ps(table.lookup(idx), _mm256_castsi256_ps(live));
      c_partial = _mm256_add_ps(c_partial, _mm256_mul_ps(c, c));
      idx = _mm256_and_si256(idx, live);
    } else {
      const __m256 c = table.lookup(idx);
      c_partial = _mm256_add_ps(c_partial, _mm256_mul_ps(c, c));
    }
    if constexpr (B <= 4) {
      const uint32_t word = pack8<B>(idx);
      const int byte = i / 8 * B;
      const int n_bytes = std::min<int>(B, int(codec.code_bytes()) - byte);
      std::memcpy(codes + byte, &word, n_bytes);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.idx.data() + i), idx);
    }
  }
  if constexpr (B > 4) {
    for (int i = 0; i < d; ++i) s.codes[i] = uint8_t(s.idx[i]);
    pack_codes(s.codes.data(), d, B, codes);
  }
  float stored = n;
  if (codec.norm_correction()) {
    const float cn = std::sqrt(reduce_tree(c_partial));
    if (cn > 0) stored = n / cn;
  }
  norm[0] = f32_to_f16(stored);
}

// Dot product of rq with the centroids of one row of codes (full groups, then the tail).
template <int B>
inline float row_dot(const float* rq, const uint8_t* row, int d, int code_bytes,
                     const CentroidTable<B>& table, const float* centroids) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const int groups = d / 8;
  int k = 0;
  for (; k + 1 < groups; k += 2) {
    const __m256i i0 = unpack8<B>(load_group<B>(row + k * B, k * B + 4 <= code_bytes));
    const __m256i i1 = unpack8<B>(load_group<B>(row + (k + 1) * B, (k + 1) * B + 4 <= code_bytes));
    acc0 = _mm256_fmadd_ps(table.lookup(i0), _mm256_loadu_ps(rq + 8 * k), acc0);
    acc1 = _mm256_fmadd_ps(table.lookup(i1), _mm256_loadu_ps(rq + 8 * k + 8), acc1);
  }
  for (; k < groups; ++k) {
    const __m256i i0 = unpack8<B>(load_group<B>(row + k * B, k * B + 4 <= code_bytes));
    acc0 = _mm256_fmadd_ps(table.lookup(i0), _mm256_loadu_ps(rq + 8 * k), acc0);
  }
  float dot = reduce_tree(_mm256_add_ps(acc0, acc1));
  for (int i = groups * 8; i < d; ++i) dot += rq[i] * centroids[packed_code_at(row, B, i)];
  return dot;
}

template <int B>
void mse_score_bits(const MseCodec& codec, const float* rq, const CodeRows& rows, int64_t n,
                    float* scores, bool add) {
  const int d = codec.dim();
  const int code_bytes = int(codec.code_bytes());
  const float* centroids = codec.codebook().centroids.data();
  const CentroidTable<B> table(centroids);
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = rows.codes + t * rows.code_stride;
    const float s = row_dot<B>(rq, row, d, code_bytes, table, centroids) *
                    f16_to_f32(rows.norms[t * rows.norm_stride]);
    scores[t] = add ? scores[t] + s : s;
  }
}

template <int B>
void mse_accumulate_bits(const MseCodec& codec, const float* weights, const CodeRows& rows,
                         int64_t n, float* acc) {
  const int d = codec.dim();
  const int code_bytes = int(codec.code_bytes());
  const float* centroids = codec.codebook().centroids.data();
  const CentroidTable<B> table(centroids);
  const int groups = d / 8;
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = rows.codes + t * rows.code_stride;
    const float coef = weights[t] * f16_to_f32(rows.norms[t * rows.norm_stride]);
    const __m256 coef8 = _mm256_set1_ps(coef);
    for (int k = 0; k < groups; ++k) {
      const __m256i idx = unpack8<B>(load_group<B>(row + k * B, k * B + 4 <= code_bytes));
      _mm256_storeu_ps(acc + 8 * k,
                       _mm256_fmadd_ps(coef8, table.lookup(idx), _mm256_loadu_ps(acc + 8 * k)));
    }
    for (int i = groups * 8; i < d; ++i) acc[i] += coef * centroids[packed_code_at(row, B, i)];
  }
}

}  // namespace

void fwht(float* z, int dim) {
  // Stages h = 1, 2, 4 inside each 8-lane register: partner = lane ^ h, the lower lane of a
  // pair takes a + b, the upper lane a - b (partner - self).
  for (int i = 0; i < dim; i += 8) {
    __m256 v = _mm256_loadu_ps(z + i);
    __m256 partner = _mm256_permute_ps(v, 0xB1);  // [1,0,3,2]
    v = _mm256_blend_ps(_mm256_add_ps(v, partner), _mm256_sub_ps(partner, v), 0xAA);
    partner = _mm256_permute_ps(v, 0x4E);  // [2,3,0,1]
    v = _mm256_blend_ps(_mm256_add_ps(v, partner), _mm256_sub_ps(partner, v), 0xCC);
    partner = _mm256_permute2f128_ps(v, v, 0x01);  // swap halves
    v = _mm256_blend_ps(_mm256_add_ps(v, partner), _mm256_sub_ps(partner, v), 0xF0);
    _mm256_storeu_ps(z + i, v);
  }
  for (int h = 8; h < dim; h *= 2) {
    for (int i = 0; i < dim; i += 2 * h) {
      for (int j = i; j < i + h; j += 8) {
        const __m256 a = _mm256_loadu_ps(z + j), b = _mm256_loadu_ps(z + j + h);
        _mm256_storeu_ps(z + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(z + j + h, _mm256_sub_ps(a, b));
      }
    }
  }
}

void dense_matvec(const float* matrix_t, const float* in, float* out, int dim) {
  // out_i = Σ_j M[i][j] in_j, j ascending, product then add; 8 outputs per register.
  const int full = dim / 8 * 8;
  for (int i = 0; i < full; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < dim; ++j) {
      const __m256 column = _mm256_loadu_ps(matrix_t + size_t(j) * dim + i);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(column, _mm256_set1_ps(in[j])));
    }
    _mm256_storeu_ps(out + i, acc);
  }
  for (int i = full; i < dim; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < dim; ++j) {
      const float product = matrix_t[size_t(j) * dim + i] * in[j];
      acc = acc + product;
    }
    out[i] = acc;
  }
}

void mse_quantize(const MseCodec& codec, const float* x, uint8_t* codes, uint16_t* norm) {
  dispatch_bits(codec.int_bits(),
                [&]<int B>() { mse_quantize_bits<B>(codec, x, codes, norm); });
}

void mse_score(const MseCodec& codec, const float* rq, const CodeRows& rows, int64_t n,
               float* scores, bool add) {
  dispatch_bits(codec.int_bits(),
                [&]<int B>() { mse_score_bits<B>(codec, rq, rows, n, scores, add); });
}

void mse_accumulate(const MseCodec& codec, const float* weights, const CodeRows& rows, int64_t n,
                    float* acc) {
  dispatch_bits(codec.int_bits(),
                [&]<int B>() { mse_accumulate_bits<B>(codec, weights, rows, n, acc); });
}

}  // namespace turbokv::quant::avx2
