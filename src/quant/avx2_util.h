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

// Loads the bytes of one group of 8 codes of B bits (B bytes) as a little-endian integer.
// may_read_4: reading 4 bytes from p stays inside the buffer (avoids a short copy for B = 3).
template <int B>
inline uint64_t load_group(const uint8_t* p, bool may_read_4) {
  uint64_t w = 0;
  if constexpr (B == 3) {
    if (may_read_4) {
      uint32_t w32;
      std::memcpy(&w32, p, 4);
      return w32 & 0xffffffu;
    }
  }
  std::memcpy(&w, p, B);
  return w;
}

// 8 codes of B bits from the group word: lanes 0..3 from the low 4B bits, 4..7 from the next.
template <int B>
inline __m256i unpack8(uint64_t w) {
  const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 0, B, 2 * B, 3 * B);
  const __m256i words = _mm256_setr_m128i(_mm_set1_epi32(int(uint32_t(w))),
                                          _mm_set1_epi32(int(uint32_t(w >> (4 * B)))));
  return _mm256_and_si256(_mm256_srlv_epi32(words, shifts), _mm256_set1_epi32((1 << B) - 1));
}

// Calls fn.template operator()<B>() for the runtime bits 1..8 (one instantiation each).
template <typename Fn>
inline void dispatch_bits(int bits, Fn&& fn) {
  switch (bits) {
    case 1: fn.template operator()<1>(); break;
    case 2: fn.template operator()<2>(); break;
    case 3: fn.template operator()<3>(); break;
    case 4: fn.template operator()<4>(); break;
    case 5: fn.template operator()<5>(); break;
    case 6: fn.template operator()<6>(); break;
    case 7: fn.template operator()<7>(); break;
    default: fn.template operator()<8>(); break;
  }
}

}  // namespace turbokv::quant::avx2
