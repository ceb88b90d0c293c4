// Helpers shared by the AVX2 codec kernels (include only from files compiled with -mavx2):
// the documented 8-lane reduction tree, loading/unpacking groups of 8 packed codes (layout of
// bitpack.h), and the runtime-bits -> template dispatch.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace turbokv::quant::avx2 {

// ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)): the documented reduction tree.
inline float reduce_tree(__m256 p) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps(p, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// Groups of 8 codes of B bits are B bytes (bitpack.h). load_codes8 reads kGroupLoadBytes<B>
// bytes from the group start (4 for B <= 4, else 8), so a caller uses it for the groups k
// with k * B + kGroupLoadBytes<B> <= code_bytes (fast_groups()) and load_codes8_exact for
// the rest (offset = k * B); both give the 8 codes as int32 lanes.
template <int B>
inline constexpr int kGroupLoadBytes = B <= 4 ? 4 : 8;

template <int B>
inline int fast_groups(int full_groups, int code_bytes) {
  const int fit = code_bytes >= kGroupLoadBytes<B> ? (code_bytes - kGroupLoadBytes<B>) / B + 1 : 0;
  return full_groups < fit ? full_groups : fit;
}

template <int B>
inline __m256i codes_from_word(uint64_t w) {
  const __m256i mask = _mm256_set1_epi32((1 << B) - 1);
  if constexpr (B <= 4) {  // all 8 codes within the low 32 bits
    const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(uint32_t(w))), shifts), mask);
  } else {  // lanes 0..3 from the low 4B bits, lanes 4..7 from the next 4B bits
    const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 0, B, 2 * B, 3 * B);
    const __m256i words = _mm256_setr_m128i(_mm_set1_epi32(int(uint32_t(w))),
                                            _mm_set1_epi32(int(uint32_t(w >> (4 * B)))));
    return _mm256_and_si256(_mm256_srlv_epi32(words, shifts), mask);
  }
}

template <int B>
inline __m256i load_codes8(const uint8_t* p) {
  uint64_t w = 0;
  std::memcpy(&w, p, kGroupLoadBytes<B>);
  return codes_from_word<B>(w);
}

// For a group whose wide load would pass the end: when the 4 bytes ending at the group's end
// lie in the row (offset >= 4 - B) one load and a shift, else a byte-exact copy.
template <int B>
inline __m256i load_codes8_exact(const uint8_t* p, int offset) {
  if constexpr (B <= 4) {
    if (offset >= 4 - B) {
      uint32_t w;
      std::memcpy(&w, p + B - 4, 4);
      return codes_from_word<B>(w >> (8 * (4 - B)));
    }
  }
  uint64_t w = 0;
  std::memcpy(&w, p, B);
  return codes_from_word<B>(w);
}

// Calls fn.template operator()<B>() for the runtime bits 1..8 (one instantiation each).
template <typename Fn>
inline void dispatch_bits(int bits, Fn&& fn) {
  switch (bits) {
    case 1:
      fn.template operator()<1>();
      break;
    case 2:
      fn.template operator()<2>();
      break;
    case 3:
      fn.template operator()<3>();
      break;
    case 4:
      fn.template operator()<4>();
      break;
    case 5:
      fn.template operator()<5>();
      break;
    case 6:
      fn.template operator()<6>();
      break;
    case 7:
      fn.template operator()<7>();
      break;
    default:
      fn.template operator()<8>();
      break;
  }
}

}  // namespace turbokv::quant::avx2
