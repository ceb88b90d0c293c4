// AVX2 + FMA + F16C vector primitives of the attention core (attention_core.h). Include only
// from *_avx2.cc files (compiled with -mavx2 -mfma -mf16c, entered after cpu_has_avx2()).
// Requires head_dim % 8 == 0.
#pragma once

#include <immintrin.h>

#include "kernels/cpu/attention_core.h"
#include "kernels/cpu/exp_avx2.h"

// Internal linkage on purpose: every ISA's translation unit compiles these templates and
// inline helpers with its own flags (-mavx2 or none), and must not share one copy with another.
namespace turbokv::attention_detail {
namespace {

struct Avx2Isa {
  static float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  // out[t] = <q, keys[t]>: four keys at a time, two accumulators each, one hadd reduction.
  template <int D>
  static void dot_rows(const float* q, const float* keys, int n, int d_runtime, float* out) {
    const int d = D > 0 ? D : d_runtime;
    int t = 0;
    for (; t + 4 <= n; t += 4) {
      const float* k0 = keys + static_cast<int64_t>(t) * d;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      int c = 0;
      for (; c + 16 <= d; c += 16) {
        const __m256 qa = _mm256_loadu_ps(q + c);
        const __m256 qb = _mm256_loadu_ps(q + c + 8);
        a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + c), a0);
        a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + d + c), a1);
        a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + 2 * d + c), a2);
        a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + 3 * d + c), a3);
        b0 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + c + 8), b0);
        b1 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + d + c + 8), b1);
        b2 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + 2 * d + c + 8), b2);
        b3 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + 3 * d + c + 8), b3);
      }
      if (c < d) {  // d % 16 == 8
        const __m256 qa = _mm256_loadu_ps(q + c);
        a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + c), a0);
        a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + d + c), a1);
        a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + 2 * d + c), a2);
        a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + 3 * d + c), a3);
      }
      a0 = _mm256_add_ps(a0, b0);
      a1 = _mm256_add_ps(a1, b1);
      a2 = _mm256_add_ps(a2, b2);
      a3 = _mm256_add_ps(a3, b3);
      // [a0 a1 a0 a1 | ...] -> four sums
      const __m256 h01 = _mm256_hadd_ps(a0, a1);
      const __m256 h23 = _mm256_hadd_ps(a2, a3);
      const __m256 h = _mm256_hadd_ps(h01, h23);
      const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      _mm_storeu_ps(out + t, sums);
    }
    for (; t < n; ++t) {
      const float* k = keys + static_cast<int64_t>(t) * d;
      __m256 a = _mm256_setzero_ps();
      for (int c = 0; c < d; c += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(k + c), a);
      out[t] = hsum(a);
    }
  }

  // scores[b][t] = <q_b, keys[t]> for b < R: two keys at a time against R query rows, so each
  // loaded key vector feeds R multiply-adds (2R independent accumulators).
  template <int D, int R>
  static void dot_block_rows(const float* q, const float* keys, int n, int d_runtime,
                             float* scores) {
    const int d = D > 0 ? D : d_runtime;
    int t = 0;
    for (; t + 2 <= n; t += 2) {
      const float* k0 = keys + static_cast<int64_t>(t) * d;
      const float* k1 = k0 + d;
      __m256 a0[R], a1[R];
      for (int b = 0; b < R; ++b) a0[b] = a1[b] = _mm256_setzero_ps();
      for (int c = 0; c < d; c += 8) {
        const __m256 x0 = _mm256_loadu_ps(k0 + c);
        const __m256 x1 = _mm256_loadu_ps(k1 + c);
        for (int b = 0; b < R; ++b) {
          const __m256 qv = _mm256_loadu_ps(q + b * d + c);
          a0[b] = _mm256_fmadd_ps(qv, x0, a0[b]);
          a1[b] = _mm256_fmadd_ps(qv, x1, a1[b]);
        }
      }
      for (int b = 0; b < R; ++b) {
        // hadd(a0, a1) per 128-bit half: [a0 pairs, a1 pairs]; halves added: [p0 p1 q0 q1];
        // one more hadd: [s0 s1 s0 s1].
        const __m256 h = _mm256_hadd_ps(a0[b], a1[b]);
        __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        x = _mm_hadd_ps(x, x);
        scores[b * kTileTokens + t] = _mm_cvtss_f32(x);
        scores[b * kTileTokens + t + 1] = _mm_cvtss_f32(_mm_movehdup_ps(x));
      }
    }
    for (; t < n; ++t) {
      const float* k = keys + static_cast<int64_t>(t) * d;
      for (int b = 0; b < R; ++b) {
        __m256 a = _mm256_setzero_ps();
        for (int c = 0; c < d; c += 8) {
          a = _mm256_fmadd_ps(_mm256_loadu_ps(q + b * d + c), _mm256_loadu_ps(k + c), a);
        }
        scores[b * kTileTokens + t] = hsum(a);
      }
    }
  }

  template <int D>
  static void dot_block(int rows, const float* q, const float* keys, int n, int d, float* scores) {
    switch (rows) {
      case 1:
        return dot_block_rows<D, 1>(q, keys, n, d, scores);
      case 2:
        return dot_block_rows<D, 2>(q, keys, n, d, scores);
      case 3:
        return dot_block_rows<D, 3>(q, keys, n, d, scores);
      default:
        return dot_block_rows<D, 4>(q, keys, n, d, scores);
    }
  }

  // acc[b] = acc[b] * alpha[b] + sum_t w[b][t] * values[t] for b < R, 16 columns at a time:
  // 2R accumulators in registers, each loaded value vector feeds R multiply-adds.
  template <int D, int R>
  static void accumulate_block_rows(float* acc, const float* alpha, const float* w,
                                    const float* values, int n, int d_runtime) {
    const int d = D > 0 ? D : d_runtime;
    int c = 0;
    for (; c + 16 <= d; c += 16) {
      __m256 a0[R], a1[R];
      for (int b = 0; b < R; ++b) {
        const __m256 scale = _mm256_set1_ps(alpha[b]);
        a0[b] = _mm256_mul_ps(_mm256_loadu_ps(acc + b * d + c), scale);
        a1[b] = _mm256_mul_ps(_mm256_loadu_ps(acc + b * d + c + 8), scale);
      }
      for (int t = 0; t < n; ++t) {
        const float* v = values + static_cast<int64_t>(t) * d + c;
        const __m256 v0 = _mm256_loadu_ps(v);
        const __m256 v1 = _mm256_loadu_ps(v + 8);
        for (int b = 0; b < R; ++b) {
          const __m256 wt = _mm256_broadcast_ss(w + b * kTileTokens + t);
          a0[b] = _mm256_fmadd_ps(wt, v0, a0[b]);
          a1[b] = _mm256_fmadd_ps(wt, v1, a1[b]);
        }
      }
      for (int b = 0; b < R; ++b) {
        _mm256_storeu_ps(acc + b * d + c, a0[b]);
        _mm256_storeu_ps(acc + b * d + c + 8, a1[b]);
      }
    }
    if (c < d) {  // d % 16 == 8
      for (int b = 0; b < R; ++b) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + b * d + c), _mm256_set1_ps(alpha[b]));
        for (int t = 0; t < n; ++t) {
          a = _mm256_fmadd_ps(_mm256_broadcast_ss(w + b * kTileTokens + t),
                              _mm256_loadu_ps(values + static_cast<int64_t>(t) * d + c), a);
        }
        _mm256_storeu_ps(acc + b * d + c, a);
      }
    }
  }

  template <int D>
  static void accumulate_block(int rows, float* acc, const float* alpha, const float* w,
                               const float* values, int n, int d) {
    switch (rows) {
      case 1:
        return accumulate_block_rows<D, 1>(acc, alpha, w, values, n, d);
      case 2:
        return accumulate_block_rows<D, 2>(acc, alpha, w, values, n, d);
      case 3:
        return accumulate_block_rows<D, 3>(acc, alpha, w, values, n, d);
      default:
        return accumulate_block_rows<D, 4>(acc, alpha, w, values, n, d);
    }
  }

  static void scale_scores(float* s, const float* token_scale, float scale) {
    const __m256 vs = _mm256_set1_ps(scale);
    for (int t = 0; t < kTileTokens; t += 8) {
      __m256 x = _mm256_loadu_ps(s + t);
      if (token_scale != nullptr) x = _mm256_mul_ps(x, _mm256_loadu_ps(token_scale + t));
      _mm256_storeu_ps(s + t, _mm256_mul_ps(x, vs));
    }
  }
  static float max_score(const float* s) {
    __m256 m = _mm256_loadu_ps(s);
    for (int t = 8; t < kTileTokens; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + t));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }
  static void multiply(const float* a, const float* b, float* out) {
    for (int t = 0; t < kTileTokens; t += 8) {
      _mm256_storeu_ps(out + t, _mm256_mul_ps(_mm256_loadu_ps(a + t), _mm256_loadu_ps(b + t)));
    }
  }

  static float exp_shifted(float* s, float m) {
    static_assert(kTileTokens % 8 == 0);
    const __m256 shift = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (int t = 0; t < kTileTokens; t += 8) {
      const __m256 e = avx2::exp8_flush_underflow(_mm256_sub_ps(_mm256_loadu_ps(s + t), shift));
      _mm256_storeu_ps(s + t, e);
      sum = _mm256_add_ps(sum, e);
    }
    return hsum(sum);
  }

  // acc[W*8 floats] = acc * alpha + sum_t p[t] * values[t][...], acc held in registers.
  template <int W>
  static void scale_accumulate_block(float* acc, __m256 alpha, const float* p, const float* values,
                                     int n, int d) {
    __m256 a[W];
    for (int j = 0; j < W; ++j) a[j] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * j), alpha);
    for (int t = 0; t < n; ++t) {
      const __m256 pt = _mm256_broadcast_ss(p + t);
      const float* v = values + static_cast<int64_t>(t) * d;
      for (int j = 0; j < W; ++j) a[j] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(v + 8 * j), a[j]);
    }
    for (int j = 0; j < W; ++j) _mm256_storeu_ps(acc + 8 * j, a[j]);
  }

  template <int D>
  static void scale_accumulate(float* acc, float alpha, const float* p, const float* values, int n,
                               int d_runtime) {
    const __m256 va = _mm256_set1_ps(alpha);
    if constexpr (D > 0) {
      constexpr int kFull = D / 64;
      constexpr int kRest = (D % 64) / 8;
      for (int b = 0; b < kFull; ++b)
        scale_accumulate_block<8>(acc + 64 * b, va, p, values + 64 * b, n, D);
      if constexpr (kRest > 0) {
        scale_accumulate_block<kRest>(acc + 64 * kFull, va, p, values + 64 * kFull, n, D);
      }
    } else {
      for (int c = 0; c < d_runtime; c += 8) {
        scale_accumulate_block<1>(acc + c, va, p, values + c, n, d_runtime);
      }
    }
  }

  static void f16_to_f32(const uint16_t* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
  }
  static void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      _mm256_storeu_ps(out + i,
                       _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
  }
};

}  // namespace
}  // namespace turbokv::attention_detail
