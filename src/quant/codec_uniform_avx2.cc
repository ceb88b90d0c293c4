// AVX2 kernels of the uniform affine codec. quantize() follows the order documented in
// codec_uniform.h (min/max are exact in any order once ±0 is canonicalized), so codes equal
// the scalar reference bit for bit; score/accumulate use FMA.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/half.h"
#include "quant/avx2_util.h"
#include "quant/codec_uniform.h"

namespace turbokv::quant::avx2 {
namespace {

inline float hmin(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

template <int B>
void uniform_score_bits(const UniformCodec& codec, const float* q, const uint8_t* codes,
                        const uint16_t* params, int64_t n, float* scores) {
  const int d = codec.dim(), group = codec.group_size(), groups = codec.groups();
  const int code_bytes = int(codec.code_bytes());
  const int fast = fast_groups<B>(d / 8, code_bytes);
  std::vector<float> q_sums(groups, 0.0f);  // [groups] Σ q over each group
  for (int i = 0; i < d; ++i) q_sums[i / group] += q[i];
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = codes + t * code_bytes;
    const uint16_t* p = params + t * codec.params_per_vector();
    float total = 0;
    for (int g = 0; g < groups; ++g) {
      const int begin = g * group, end = std::min(d, begin + group);
      const int full_end = begin + (end - begin) / 8 * 8;
      __m256 acc = _mm256_setzero_ps();
      for (int i = begin; i < full_end; i += 8) {
        const int k = i / 8;
        const __m256i idx =
            k < fast ? load_codes8<B>(row + k * B) : load_codes8_exact<B>(row + k * B, k * B);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(idx), _mm256_loadu_ps(q + i), acc);
      }
      float dot = reduce_tree(acc);
      for (int i = full_end; i < end; ++i) dot += q[i] * float(packed_code_at(row, B, i));
      total += f16_to_f32(p[2 * g]) * dot + f16_to_f32(p[2 * g + 1]) * q_sums[g];
    }
    scores[t] = total;
  }
}

template <int B>
void uniform_accumulate_bits(const UniformCodec& codec, const float* weights, const uint8_t* codes,
                             const uint16_t* params, int64_t n, float* acc) {
  const int d = codec.dim(), group = codec.group_size(), groups = codec.groups();
  const int code_bytes = int(codec.code_bytes());
  const int fast = fast_groups<B>(d / 8, code_bytes);
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = codes + t * code_bytes;
    const uint16_t* p = params + t * codec.params_per_vector();
    const __m256 w = _mm256_set1_ps(weights[t]);
    for (int g = 0; g < groups; ++g) {
      const int begin = g * group, end = std::min(d, begin + group);
      const int full_end = begin + (end - begin) / 8 * 8;
      const float s = f16_to_f32(p[2 * g]), m = f16_to_f32(p[2 * g + 1]);
      const __m256 s8 = _mm256_set1_ps(s), m8 = _mm256_set1_ps(m);
      for (int i = begin; i < full_end; i += 8) {
        const int k = i / 8;
        const __m256i idx =
            k < fast ? load_codes8<B>(row + k * B) : load_codes8_exact<B>(row + k * B, k * B);
        const __m256 value = _mm256_fmadd_ps(s8, _mm256_cvtepi32_ps(idx), m8);
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(w, value, _mm256_loadu_ps(acc + i)));
      }
      for (int i = full_end; i < end; ++i) {
        acc[i] += weights[t] * (s * float(packed_code_at(row, B, i)) + m);
      }
    }
  }
}

}  // namespace

void uniform_quantize(const UniformCodec& codec, const float* x, uint8_t* codes, uint16_t* params) {
  const int d = codec.dim(), group = codec.group_size();
  thread_local std::vector<uint8_t> q;
  q.resize(d);
  for (int g = 0; g < codec.groups(); ++g) {
    const int begin = g * group, end = std::min(d, begin + group);
    const int full_end = begin + (end - begin) / 8 * 8;
    float mn = x[begin], mx = x[begin];
    if (full_end > begin) {
      __m256 vmin = _mm256_loadu_ps(x + begin), vmax = vmin;
      for (int i = begin + 8; i < full_end; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        vmin = _mm256_min_ps(vmin, v);
        vmax = _mm256_max_ps(vmax, v);
      }
      mn = hmin(vmin);
      mx = hmax(vmax);
    }
    for (int i = full_end; i < end; ++i) {
      mn = std::fmin(mn, x[i]);
      mx = std::fmax(mx, x[i]);
    }
    const UniformGroupScale scale = uniform_group_params(mn, mx, codec.bits(), params + 2 * g);
    const __m256 m8 = _mm256_set1_ps(scale.min), inv8 = _mm256_set1_ps(scale.inv_scale);
    const __m256 half = _mm256_set1_ps(0.5f), top8 = _mm256_set1_ps(scale.top);
    for (int i = begin; i < full_end; i += 8) {
      __m256 level = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m8), inv8);
      level = _mm256_floor_ps(_mm256_add_ps(level, half));
      level = _mm256_min_ps(_mm256_max_ps(level, _mm256_setzero_ps()), top8);
      const __m256i as_int = _mm256_cvttps_epi32(level);
      const __m128i words =
          _mm_packus_epi32(_mm256_castsi256_si128(as_int), _mm256_extracti128_si256(as_int, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q.data() + i), _mm_packus_epi16(words, words));
    }
    uniform_group_codes(x, full_end, end, scale, q.data());
  }
  pack_codes(q.data(), d, codec.bits(), codes);
}

void uniform_score(const UniformCodec& codec, const float* q, const uint8_t* codes,
                   const uint16_t* params, int64_t n, float* scores) {
  dispatch_bits(codec.bits(),
                [&]<int B>() { uniform_score_bits<B>(codec, q, codes, params, n, scores); });
}

void uniform_accumulate(const UniformCodec& codec, const float* weights, const uint8_t* codes,
                        const uint16_t* params, int64_t n, float* acc) {
  dispatch_bits(codec.bits(), [&]<int B>() {
    uniform_accumulate_bits<B>(codec, weights, codes, params, n, acc);
  });
}

}  // namespace turbokv::quant::avx2
