// Attention on TurboQuant codes, AVX2 path. Codes of up to 4 bits are decoded 8 at a time in
// registers: the codec's LSB-first layout (quant/bitpack.h) puts 8 codes in b bytes, so one
// 32-bit broadcast load and vpsrlvd give 8 indices; vpermps looks them up in the codebook
// (16 centroids: two lookups and a blend on bit 3, or one AVX-512VL vpermi2ps where the CPU
// has it). Decode (one query) looks centroids up right where they are multiplied: each group
// of 8 feeds the multiply-adds of all GQA rows, nothing is written to memory. Prefill decodes
// a tile into scratch once for all its queries. Wider codes go through the codec's
// decode_rotated.
#include <atomic>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/attention_codes_core.h"
#include "kernels/cpu/attention_entry.h"
#include "kernels/cpu/attention_isa_avx2.h"

namespace turbokv::attention_detail {
namespace {

// The 4 bytes at p (a group of 8 codes starts there; storage keeps 4 bytes of padding after
// the last vector) broadcast to all 8 lanes with one load.
inline __m256i load_group_word(const uint8_t* p) {
  int32_t word;
  std::memcpy(&word, p, sizeof(word));
  return _mm256_set1_epi32(word);
}

// Centroids of the 8 codes of B bits at p (B <= 4). vpermps reads only bits 0-2 of each
// index, so the bits above a code need clearing only when B < 3; for B = 4 the second lookup
// (centroids 8-15) is picked by bit 3, moved to the sign bit that blendv reads.
template <int B>
inline __m256 lookup_group(const uint8_t* p, __m256i shifts, __m256 low_table, __m256 high_table) {
  __m256i idx = _mm256_srlv_epi32(load_group_word(p), shifts);
  if constexpr (B < 3) idx = _mm256_and_si256(idx, _mm256_set1_epi32((1 << B) - 1));
  const __m256 c = _mm256_permutevar8x32_ps(low_table, idx);
  if constexpr (B < 4) return c;
  const __m256 high = _mm256_permutevar8x32_ps(high_table, idx);
  return _mm256_blendv_ps(c, high, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

std::atomic<bool> avx512vl_lookups_allowed{true};

bool use_avx512vl_lookups() {
  static const bool has_avx512vl = __builtin_cpu_supports("avx512vl");
  return has_avx512vl && avx512vl_lookups_allowed.load(std::memory_order_relaxed);
}

// B = 4 with AVX-512VL: vpermi2ps looks up all 16 centroids at once (bits 0-3 of the index).
// Written as inline assembly so this translation unit keeps AVX2 flags; only called after
// has_avx512vl().
inline __m256 lookup_group16_vl(const uint8_t* p, __m256i shifts, __m256 low_table,
                                __m256 high_table) {
  __m256 idx = _mm256_castsi256_ps(_mm256_srlv_epi32(load_group_word(p), shifts));
  asm("vpermi2ps %2, %1, %0" : "+x"(idx) : "x"(low_table), "x"(high_table));
  return idx;
}

template <int B>
__m256i group_shifts() {
  return _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
}

// scores[b][t, t + 1] = the sums of a0[b] and a1[b] for b < R, reduced together: four hadds
// pair the rows' two tokens, two more and one cross-lane add give
// [r0t0 r0t1 r1t0 r1t1 | r2t0 r2t1 r3t0 r3t1].
template <int R>
inline void store_pair_sums(const __m256* a0, const __m256* a1, float* scores) {
  const __m256 h0 = _mm256_hadd_ps(a0[0], a1[0]);
  const __m256 h1 = _mm256_hadd_ps(a0[1], a1[1]);
  const __m256 h2 = _mm256_hadd_ps(a0[2], a1[2]);
  const __m256 h3 = _mm256_hadd_ps(a0[3], a1[3]);
  const __m256 k01 = _mm256_hadd_ps(h0, h1);
  const __m256 k23 = _mm256_hadd_ps(h2, h3);
  const __m256 sums =
      _mm256_add_ps(_mm256_permute2f128_ps(k01, k23, 0x20), _mm256_permute2f128_ps(k01, k23, 0x31));
  const __m128 rows01 = _mm256_castps256_ps128(sums);
  const __m128 rows23 = _mm256_extractf128_ps(sums, 1);
  _mm_storel_pi(reinterpret_cast<__m64*>(scores), rows01);
  if constexpr (R > 1) _mm_storeh_pi(reinterpret_cast<__m64*>(scores + kTileTokens), rows01);
  if constexpr (R > 2) _mm_storel_pi(reinterpret_cast<__m64*>(scores + 2 * kTileTokens), rows23);
  if constexpr (R > 3) _mm_storeh_pi(reinterpret_cast<__m64*>(scores + 3 * kTileTokens), rows23);
}

// scores[b][t] = <q_b, centroids of token t>, two tokens at a time: each looked-up group of 8
// centroids feeds R multiply-adds (2R accumulators).
template <int B, int R>
void score_codes_bits(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                      const float* q, int d, int n, float* scores) {
  const __m256i shifts = group_shifts<B>();
  const __m256 low_table = _mm256_load_ps(seg.centroids);
  const __m256 high_table = _mm256_load_ps(seg.centroids + 8);
  const int groups = d / 8;
  int t = 0;
  for (; t + 2 <= n; t += 2) {
    const uint8_t* c0 = codes + t * code_stride;
    const uint8_t* c1 = c0 + code_stride;
    __m256 a0[4], a1[4];  // rows past R stay zero
    for (int b = 0; b < 4; ++b) a0[b] = a1[b] = _mm256_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      const __m256 x0 = lookup_group<B>(c0 + g * B, shifts, low_table, high_table);
      const __m256 x1 = lookup_group<B>(c1 + g * B, shifts, low_table, high_table);
      for (int b = 0; b < R; ++b) {
        const __m256 qv = _mm256_loadu_ps(q + b * d + 8 * g);
        a0[b] = _mm256_fmadd_ps(qv, x0, a0[b]);
        a1[b] = _mm256_fmadd_ps(qv, x1, a1[b]);
      }
    }
    store_pair_sums<R>(a0, a1, scores + t);
  }
  for (; t < n; ++t) {
    const uint8_t* c0 = codes + t * code_stride;
    __m256 a[R];
    for (int b = 0; b < R; ++b) a[b] = _mm256_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      const __m256 x = lookup_group<B>(c0 + g * B, shifts, low_table, high_table);
      for (int b = 0; b < R; ++b)
        a[b] = _mm256_fmadd_ps(_mm256_loadu_ps(q + b * d + 8 * g), x, a[b]);
    }
    for (int b = 0; b < R; ++b) scores[b * kTileTokens + t] = Avx2Isa::hsum(a[b]);
  }
}

// acc[b][8G columns from group g0] = acc * alpha[b] + sum_t w[b][t] * centroids, the R x G
// accumulators held in registers over the tokens: each looked-up group feeds R multiply-adds.
template <int B, int R, int G, bool kVl>
__attribute__((always_inline)) inline void accumulate_code_groups(const CodeSegment& seg,
                                                                  const uint8_t* codes,
                                                                  size_t code_stride, int g0,
                                                                  float* acc, const float* alpha,
                                                                  const float* w, int d, int n) {
  const __m256i shifts = group_shifts<B>();
  const __m256 low_table = _mm256_load_ps(seg.centroids);
  const __m256 high_table = _mm256_load_ps(seg.centroids + 8);
  __m256 a[R][G];
  for (int b = 0; b < R; ++b) {
    const __m256 scale = _mm256_set1_ps(alpha[b]);
    for (int j = 0; j < G; ++j) {
      a[b][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + b * d + 8 * (g0 + j)), scale);
    }
  }
  for (int t = 0; t < n; ++t) {
    const uint8_t* c = codes + t * code_stride + g0 * B;
    __m256 x[G];
    for (int j = 0; j < G; ++j) {
      if constexpr (B == 4 && kVl) {
        x[j] = lookup_group16_vl(c + j * B, shifts, low_table, high_table);
      } else {
        x[j] = lookup_group<B>(c + j * B, shifts, low_table, high_table);
      }
    }
    for (int b = 0; b < R; ++b) {
      const __m256 wt = _mm256_broadcast_ss(w + b * kTileTokens + t);
      for (int j = 0; j < G; ++j) a[b][j] = _mm256_fmadd_ps(wt, x[j], a[b][j]);
    }
  }
  for (int b = 0; b < R; ++b) {
    for (int j = 0; j < G; ++j) _mm256_storeu_ps(acc + b * d + 8 * (g0 + j), a[b][j]);
  }
}

template <int B, int R, bool kVl>
void accumulate_codes_bits(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                           float* acc, const float* alpha, const float* w, int d, int n) {
  const int groups = d / 8;
  int g = 0;
  for (; g + 2 <= groups; g += 2) {
    accumulate_code_groups<B, R, 2, kVl>(seg, codes, code_stride, g, acc, alpha, w, d, n);
  }
  if (g < groups) {
    accumulate_code_groups<B, R, 1, kVl>(seg, codes, code_stride, g, acc, alpha, w, d, n);
  }
}

// Calls fn.template operator()<B, R>() for the segment's bits and rows (1..4 each).
template <class Fn>
void dispatch_bits_rows(int bits, int rows, Fn&& fn) {
  auto with_rows = [&]<int B>() {
    switch (rows) {
      case 1:
        return fn.template operator()<B, 1>();
      case 2:
        return fn.template operator()<B, 2>();
      case 3:
        return fn.template operator()<B, 3>();
      default:
        return fn.template operator()<B, 4>();
    }
  };
  switch (bits) {
    case 1:
      return with_rows.template operator()<1>();
    case 2:
      return with_rows.template operator()<2>();
    case 3:
      return with_rows.template operator()<3>();
    default:
      return with_rows.template operator()<4>();
  }
}

template <int B, bool kApplyNorm>
void decode_tile_bits(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                      const uint16_t* norms, int norm_stride, int n, float* out, int d,
                      float* norms_out) {
  const __m256i shifts = group_shifts<B>();
  const __m256 low_table = _mm256_load_ps(seg.centroids);
  const __m256 high_table = _mm256_load_ps(seg.centroids + 8);
  const int groups = seg.dim / 8;
  for (int i = 0; i < n; ++i) {
    const uint8_t* vector_codes = codes + i * code_stride;
    float* row = out + static_cast<int64_t>(i) * d;
    const float norm = _cvtsh_ss(norms[i * norm_stride]);
    const __m256 scale = _mm256_set1_ps(norm);
    if constexpr (!kApplyNorm) norms_out[i] = norm;
#pragma GCC unroll 4
    for (int g = 0; g < groups; ++g) {
      const __m256 c = lookup_group<B>(vector_codes + g * B, shifts, low_table, high_table);
      _mm256_storeu_ps(row + 8 * g, kApplyNorm ? _mm256_mul_ps(c, scale) : c);
    }
  }
}

struct RegisterDecoder {
  static constexpr bool kFused = true;

  static void norms(const uint16_t* norms, int n, float* out) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(
          out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(norms + i))));
    }
    for (; i < n; ++i) out[i] = _cvtsh_ss(norms[i]);
  }
  static void score_codes(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                          int rows, const float* q, int d, int n, float* scores) {
    dispatch_bits_rows(seg.bits, rows, [&]<int B, int R>() {
      score_codes_bits<B, R>(seg, codes, code_stride, q, d, n, scores);
    });
  }
  static void accumulate_codes(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                               int rows, float* acc, const float* alpha, const float* w, int d,
                               int n) {
    const bool vl = use_avx512vl_lookups();
    dispatch_bits_rows(seg.bits, rows, [&]<int B, int R>() {
      if (vl) {
        accumulate_codes_bits<B, R, true>(seg, codes, code_stride, acc, alpha, w, d, n);
      } else {
        accumulate_codes_bits<B, R, false>(seg, codes, code_stride, acc, alpha, w, d, n);
      }
    });
  }

  static void decode_tile(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                          const uint16_t* norms, int norm_stride, int n, float* out, int d,
                          float* norms_out) {
    if (seg.dim % 8 != 0 || seg.bits > 4) {
      const uint16_t unit_norm = 0x3C00;  // 1.0 in fp16
      for (int i = 0; i < n; ++i) {
        const uint16_t norm = norms[i * norm_stride];
        if (norms_out != nullptr) norms_out[i] = _cvtsh_ss(norm);
        seg.codec->decode_rotated(codes + i * code_stride, norms_out != nullptr ? unit_norm : norm,
                                  out + i * d);
      }
      return;
    }
    if (norms_out != nullptr) {
      dispatch_bits<false>(seg, codes, code_stride, norms, norm_stride, n, out, d, norms_out);
    } else {
      dispatch_bits<true>(seg, codes, code_stride, norms, norm_stride, n, out, d, norms_out);
    }
  }

  template <bool kApplyNorm>
  static void dispatch_bits(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                            const uint16_t* norms, int norm_stride, int n, float* out, int d,
                            float* norms_out) {
    switch (seg.bits) {
      case 1:
        return decode_tile_bits<1, kApplyNorm>(seg, codes, code_stride, norms, norm_stride, n, out,
                                               d, norms_out);
      case 2:
        return decode_tile_bits<2, kApplyNorm>(seg, codes, code_stride, norms, norm_stride, n, out,
                                               d, norms_out);
      case 3:
        return decode_tile_bits<3, kApplyNorm>(seg, codes, code_stride, norms, norm_stride, n, out,
                                               d, norms_out);
      default:
        return decode_tile_bits<4, kApplyNorm>(seg, codes, code_stride, norms, norm_stride, n, out,
                                               d, norms_out);
    }
  }
};

// Uniform: 8 codes -> floats, then scale * q + min (multiply, then add: the rounding of
// UniformCodec::dequantize). Needs bits <= 4 and groups of a multiple of 8 elements.
template <int B>
void decode_uniform(const quant::UniformCodec& codec, const uint8_t* codes, const uint16_t* params,
                    float* out) {
  const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
  const __m256i mask = _mm256_set1_epi32((1 << B) - 1);
  const int per_group = codec.group_size() / 8;
  for (int g = 0; g < codec.dim() / 8; ++g) {
    const uint16_t* group = params + 2 * (g / per_group);
    const __m256i idx =
        _mm256_and_si256(_mm256_srlv_epi32(load_group_word(codes + g * B), shifts), mask);
    const __m256 x =
        _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(group[0])), _mm256_cvtepi32_ps(idx)),
                      _mm256_set1_ps(_cvtsh_ss(group[1])));
    _mm256_storeu_ps(out + 8 * g, x);
  }
}

struct UniformRegisterDecoder {
  static void decode(const quant::UniformCodec& codec, const uint8_t* codes, const uint16_t* params,
                     float* out) {
    if (codec.dim() % 8 != 0 || codec.bits() > 4 || codec.dim() % codec.group_size() != 0) {
      codec.dequantize(codes, params, out);
      return;
    }
    switch (codec.bits()) {
      case 2:
        return decode_uniform<2>(codec, codes, params, out);
      case 3:
        return decode_uniform<3>(codec, codes, params, out);
      default:
        return decode_uniform<4>(codec, codes, params, out);
    }
  }
};

}  // namespace

void attention_uniform_avx2(const UniformKVView& kv, const AttentionQueries& queries,
                            const AttentionParams& params, float* out, float* lse) {
  attention_uniform_on<Avx2Isa, UniformRegisterDecoder>(kv, queries, params, out, lse);
}

void allow_avx512vl_lookups(bool allowed) {
  avx512vl_lookups_allowed.store(allowed, std::memory_order_relaxed);
}

void attention_turboquant_avx2(const TurboQuantKVView& kv, const AttentionQueries& queries,
                               const AttentionParams& params, float* out, float* lse) {
  attention_turboquant_on<Avx2Isa, RegisterDecoder>(kv, queries, params, out, lse,
                                                    quant::Isa::kAvx2);
}

}  // namespace turbokv::attention_detail
