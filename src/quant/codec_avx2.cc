// AVX2 kernels of the TurboQuant codecs: FWHT, dense rotation, MSE quantize/score/accumulate. Only
// entered after cpu_has_avx2(). Quantize paths follow the operation order documented in codec_mse.h
// / rotation.h exactly (no FMA), so their codes equal the scalar reference bit for bit;
// score/accumulate use FMA.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "quant/avx2_util.h"
#include "quant/codec_mse.h"
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
  std::vector<float> values;   // [dim rounded up to 8]
  std::vector<float> rotated;  // [dim rounded up to 8]
  std::vector<int32_t> idx;    // [dim rounded up to 8]
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

// Σ C[idx]² and Σ y_i C[idx_i], each in the documented tree of 8 partial sums.
struct CentroidSums {
  float energy = 0;
  float dot = 0;
};

// Steps 4-6 of quantize on y [padded] (rotated unit vector, zero padding): nearest centroid,
// centroid energy and projection for the stored norm, packing.
template <int B>
CentroidSums code_rotated(const MseCodec& codec, const float* y, uint8_t* codes, Scratch& s) {
  const int d = codec.dim();
  const int padded = (d + 7) / 8 * 8;
  const Codebook& book = codec.codebook();
  const CentroidTable<B> table(book.centroids.data());
  __m256 c_partial = _mm256_setzero_ps();
  __m256 dot_partial = _mm256_setzero_ps();
  for (int i = 0; i < padded; i += 8) {
    const __m256 yv = _mm256_loadu_ps(y + i);
    __m256i idx = nearest8<B>(yv, book.boundaries.data());
    if (i + 8 > d) {  // zero the padding lanes: no centroid energy, no stray code bits
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(d - i), lane);
      const __m256 c = _mm256_and_ps(table.lookup(idx), _mm256_castsi256_ps(live));
      c_partial = _mm256_add_ps(c_partial, _mm256_mul_ps(c, c));
      dot_partial = _mm256_add_ps(dot_partial, _mm256_mul_ps(yv, c));
      idx = _mm256_and_si256(idx, live);
    } else {
      const __m256 c = table.lookup(idx);
      c_partial = _mm256_add_ps(c_partial, _mm256_mul_ps(c, c));
      dot_partial = _mm256_add_ps(dot_partial, _mm256_mul_ps(yv, c));
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
  return CentroidSums{reduce_tree(c_partial), reduce_tree(dot_partial)};
}

template <int B>
void mse_quantize_bits(const MseCodec& codec, const float* x, uint8_t* codes, uint16_t* norm) {
  const int d = codec.dim();
  const int padded = (d + 7) / 8 * 8;
  Scratch& s = scratch(padded);
  float* y = s.rotated.data();  // [padded]
  const Rotation& rotation = codec.rotation();
  float n;
  if (rotation.is_hadamard() && d % 8 == 0) {
    // Fused: u = x * inv with the sign flip as an XOR, butterflies, scale (rotation.h order).
    __m256 partial = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      partial = _mm256_add_ps(partial, _mm256_mul_ps(v, v));
    }
    n = std::sqrt(reduce_tree(partial));
    const __m256 inv = _mm256_set1_ps(1.0f / std::fmax(n, 1e-6f));
    const uint32_t* masks = rotation.sign_masks().data();
    for (int i = 0; i < d; i += 8) {
      const __m256 flip =
          _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(masks + i)));
      _mm256_storeu_ps(y + i, _mm256_xor_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv), flip));
    }
    fwht(y, d);
    const __m256 scale = _mm256_set1_ps(rotation.hadamard_scale());
    for (int i = 0; i < d; i += 8)
      _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), scale));
  } else {
    float* u = s.values.data();  // [padded]
    std::memcpy(u, x, sizeof(float) * d);
    std::fill(u + d, u + padded, 0.0f);
    __m256 partial = _mm256_setzero_ps();
    for (int i = 0; i < padded; i += 8) {
      const __m256 v = _mm256_loadu_ps(u + i);
      partial = _mm256_add_ps(partial, _mm256_mul_ps(v, v));
    }
    n = std::sqrt(reduce_tree(partial));
    const __m256 inv = _mm256_set1_ps(1.0f / std::fmax(n, 1e-6f));
    for (int i = 0; i < padded; i += 8) {
      _mm256_storeu_ps(u + i, _mm256_mul_ps(_mm256_loadu_ps(u + i), inv));
    }
    rotation.apply(u, y, Isa::kAvx2);
    std::fill(y + d, y + padded, 0.0f);
  }
  const CentroidSums sums = code_rotated<B>(codec, y, codes, s);
  float stored = n;
  if (codec.unbiased_norm()) {
    if (sums.dot > 0) stored = n / sums.dot;
  } else if (codec.norm_correction()) {
    const float cn = std::sqrt(sums.energy);
    if (cn > 0) stored = n / cn;
  }
  norm[0] = f32_to_f16(stored);
}

// 8 codes of group k of a row as centroid values.
template <int B>
inline __m256 group_centroids(const uint8_t* row, int k, int fast, const CentroidTable<B>& table) {
  const __m256i idx =
      k < fast ? load_codes8<B>(row + k * B) : load_codes8_exact<B>(row + k * B, k * B);
  return table.lookup(idx);
}

// Scores of M queries against every row: codes unpacked and looked up once per group, two
// accumulators per query (even / odd groups) to hide FMA latency.
template <int B, int M>
void score_block(const MseCodec& codec, const float* const* rq, const CodeRows& rows, int64_t n,
                 float* const* scores, bool add) {
  const int d = codec.dim();
  const float* centroids = codec.codebook().centroids.data();
  const CentroidTable<B> table(centroids);
  const int groups = d / 8;
  const int fast = fast_groups<B>(groups, int(codec.code_bytes()));
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = rows.codes + t * rows.code_stride;
    __m256 even[M], odd[M];
    for (int j = 0; j < M; ++j) even[j] = odd[j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 1 < groups; k += 2) {
      const __m256 c0 = group_centroids<B>(row, k, fast, table);
      const __m256 c1 = group_centroids<B>(row, k + 1, fast, table);
      for (int j = 0; j < M; ++j) {
        even[j] = _mm256_fmadd_ps(c0, _mm256_loadu_ps(rq[j] + 8 * k), even[j]);
        odd[j] = _mm256_fmadd_ps(c1, _mm256_loadu_ps(rq[j] + 8 * k + 8), odd[j]);
      }
    }
    if (k < groups) {
      const __m256 c0 = group_centroids<B>(row, k, fast, table);
      for (int j = 0; j < M; ++j) {
        even[j] = _mm256_fmadd_ps(c0, _mm256_loadu_ps(rq[j] + 8 * k), even[j]);
      }
    }
    const float norm = f16_to_f32(rows.norms[t * rows.norm_stride]);
    for (int j = 0; j < M; ++j) {
      float dot = reduce_tree(_mm256_add_ps(even[j], odd[j]));
      for (int i = groups * 8; i < d; ++i) dot += rq[j][i] * centroids[packed_code_at(row, B, i)];
      const float s = dot * norm;
      scores[j][t] = add ? scores[j][t] + s : s;
    }
  }
}

// acc_j += Σ_t coef_j[t] · C[codes of row t] for M weight rows, rows in tiles so that each
// group's accumulators stay in registers across a tile (two per weight row: even / odd rows).
template <int B, int M>
void accumulate_block(const MseCodec& codec, const float* const* weights, const CodeRows& rows,
                      int64_t n, float* const* acc) {
  const int d = codec.dim();
  const float* centroids = codec.codebook().centroids.data();
  const CentroidTable<B> table(centroids);
  const int groups = d / 8;
  const int fast = fast_groups<B>(groups, int(codec.code_bytes()));
  constexpr int kTile = 64;
  float coef[M][kTile];
  for (int64_t start = 0; start < n; start += kTile) {
    const int rows_in_tile = int(std::min<int64_t>(kTile, n - start));
    for (int r = 0; r < rows_in_tile; ++r) {
      const float norm = f16_to_f32(rows.norms[(start + r) * rows.norm_stride]);
      for (int j = 0; j < M; ++j) coef[j][r] = weights[j][start + r] * norm;
    }
    const uint8_t* tile = rows.codes + start * rows.code_stride;
    for (int k = 0; k < groups; ++k) {
      __m256 even[M], odd[M];
      for (int j = 0; j < M; ++j) even[j] = odd[j] = _mm256_setzero_ps();
      int r = 0;
      for (; r + 1 < rows_in_tile; r += 2) {
        const __m256 c0 = group_centroids<B>(tile + r * rows.code_stride, k, fast, table);
        const __m256 c1 = group_centroids<B>(tile + (r + 1) * rows.code_stride, k, fast, table);
        for (int j = 0; j < M; ++j) {
          even[j] = _mm256_fmadd_ps(_mm256_set1_ps(coef[j][r]), c0, even[j]);
          odd[j] = _mm256_fmadd_ps(_mm256_set1_ps(coef[j][r + 1]), c1, odd[j]);
        }
      }
      if (r < rows_in_tile) {
        const __m256 c0 = group_centroids<B>(tile + r * rows.code_stride, k, fast, table);
        for (int j = 0; j < M; ++j) {
          even[j] = _mm256_fmadd_ps(_mm256_set1_ps(coef[j][r]), c0, even[j]);
        }
      }
      for (int j = 0; j < M; ++j) {
        float* out = acc[j] + 8 * k;
        _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), _mm256_add_ps(even[j], odd[j])));
      }
    }
    for (int r = 0; r < rows_in_tile; ++r) {
      const uint8_t* row = tile + r * rows.code_stride;
      for (int i = groups * 8; i < d; ++i) {
        const float c = centroids[packed_code_at(row, B, i)];
        for (int j = 0; j < M; ++j) acc[j][i] += coef[j][r] * c;
      }
    }
  }
}

// Runs block<M>(first) for query blocks of up to 4 (M = 1..4).
template <typename Block>
void for_query_blocks(int count, Block&& block) {
  for (int first = 0; first < count; first += 4) {
    switch (std::min(4, count - first)) {
      case 1:
        block.template operator()<1>(first);
        break;
      case 2:
        block.template operator()<2>(first);
        break;
      case 3:
        block.template operator()<3>(first);
        break;
      default:
        block.template operator()<4>(first);
        break;
    }
  }
}

template <int B>
void mse_score_bits(const MseCodec& codec, const QueryRows& queries, const CodeRows& rows,
                    int64_t n, float* scores, bool add) {
  for_query_blocks(queries.count, [&]<int M>(int first) {
    const float* rq[M];
    float* out[M];
    for (int j = 0; j < M; ++j) {
      rq[j] = queries.data + (first + j) * queries.stride;
      out[j] = scores + (first + j) * n;
    }
    score_block<B, M>(codec, rq, rows, n, out, add);
  });
}

template <int B>
void mse_accumulate_bits(const MseCodec& codec, const QueryRows& weights, const CodeRows& rows,
                         int64_t n, float* acc, size_t acc_stride) {
  for_query_blocks(weights.count, [&]<int M>(int first) {
    const float* w[M];
    float* out[M];
    for (int j = 0; j < M; ++j) {
      w[j] = weights.data + (first + j) * weights.stride;
      out[j] = acc + (first + j) * acc_stride;
    }
    accumulate_block<B, M>(codec, w, rows, n, out);
  });
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
  dispatch_bits(codec.int_bits(), [&]<int B>() { mse_quantize_bits<B>(codec, x, codes, norm); });
}

void mse_score(const MseCodec& codec, const QueryRows& queries, const CodeRows& rows, int64_t n,
               float* scores, bool add) {
  dispatch_bits(codec.int_bits(),
                [&]<int B>() { mse_score_bits<B>(codec, queries, rows, n, scores, add); });
}

void mse_accumulate(const MseCodec& codec, const QueryRows& weights, const CodeRows& rows,
                    int64_t n, float* acc, size_t acc_stride) {
  dispatch_bits(codec.int_bits(),
                [&]<int B>() { mse_accumulate_bits<B>(codec, weights, rows, n, acc, acc_stride); });
}

}  // namespace turbokv::quant::avx2
