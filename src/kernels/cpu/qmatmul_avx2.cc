// AVX2 integer dot products of quantized weight rows (qweights.h) with int8 activation blocks:
// each 32 weights are unpacked to bytes, multiplied with the 32 activation bytes by
// maddubs/madd into 8 int32 lanes, and the lanes are scaled by weight scale × activation scale
// into f32 accumulators. Signed weights use |w| · sign(x, w) (maddubs takes one unsigned
// operand); no pair sum can saturate: |w| <= 128, |x| <= 127.
#include "kernels/cpu/qmatmul_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/half.h"

namespace turbokv::avx2 {
namespace {

constexpr int kMaxGroup = 4;  // activation rows that share one pass over the weights

inline float half_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return _cvtsh_ss(v);
}

inline float scale_at(const uint8_t* p, DType dtype) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return dtype == DType::F16 ? _cvtsh_ss(v) : bf16_to_f32(v);
}

inline __m256i ones16() {
  return _mm256_set1_epi16(1);
}

// 8 int32 sums of w · x over 32 bytes, w signed.
inline __m256i dot_signed(__m256i w, __m256i x) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(p, ones16());
}

// The same with int16 weights per pair of int16 products (Q6_K: one scale per 16 values).
inline __m256i dot_signed_scaled(__m256i w, __m256i x, __m256i scales16) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(p, scales16);
}

// w unsigned (0..15 or 0..63).
inline __m256i dot_unsigned(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones16());
}

// 16 packed bytes -> 32 values: low nibbles in lanes 0..15, high nibbles in lanes 16..31.
inline __m256i unpack_nibbles16(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// Bit j of bits -> 0x10 in byte j, else 0.
inline __m256i bits_to_0x10(uint32_t bits) {
  const __m256i select = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), select);
  const __m256i mask = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Weight bytes requested ahead of each row stream (as in qmatmul_avx512.cc: the quantized
// streams are too sparse in time for the hardware prefetcher alone).
constexpr int kPrefetchBytes = 4096;

inline void prefetch(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
}

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// The activation rows of one product: block c of row i is q + i * cols + 32 c, d[i * nb + c].
struct Rows {
  const int8_t* q;
  const float* d;
  const float* dsum;
  int64_t cols, nb;
  const int8_t* xq(int i, int64_t c) const { return q + i * cols + 32 * c; }
  float dx(int i, int64_t c) const { return d[i * nb + c]; }
  float sx(int i, int64_t c) const { return dsum[i * nb + c]; }
};

// acc[i] += (scale · d_i) · Σ w · x_i over block c, for the M activation rows.
template <bool Signed, int M>
inline void accumulate(const Rows& x, int64_t c, __m256i w, float scale, __m256* acc) {
  for (int i = 0; i < M; ++i) {
    const __m256i x8 = load32(x.xq(i, c));
    const __m256i s = Signed ? dot_signed(w, x8) : dot_unsigned(w, x8);
    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(scale * x.dx(i, c)), acc[i]);
  }
}

// One weight row of each format against all activation rows: out[i] (plus extra[i] for
// terms accumulated as scalars).
template <int M>
void row_q8_0(const uint8_t* row, const Rows& x, __m256* acc, float*) {
  for (int64_t c = 0; c < x.nb; ++c) {
    const uint8_t* b = row + 34 * c;
    prefetch(b);
    accumulate<true, M>(x, c, load32(b + 2), half_at(b), acc);
  }
}

template <int M>
void row_q4_0(const uint8_t* row, const Rows& x, __m256* acc, float*) {
  for (int64_t c = 0; c < x.nb; ++c) {
    const uint8_t* b = row + 18 * c;
    if (c % 2 == 0) prefetch(b);
    const __m256i w = _mm256_sub_epi8(unpack_nibbles16(b + 2), _mm256_set1_epi8(8));
    accumulate<true, M>(x, c, w, half_at(b), acc);
  }
}

template <int M>
void row_q5_0(const uint8_t* row, const Rows& x, __m256* acc, float*) {
  for (int64_t c = 0; c < x.nb; ++c) {
    const uint8_t* b = row + 22 * c;
    if (c % 2 == 0) prefetch(b);
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m256i q = _mm256_or_si256(unpack_nibbles16(b + 6), bits_to_0x10(qh));
    accumulate<true, M>(x, c, _mm256_sub_epi8(q, _mm256_set1_epi8(16)), half_at(b), acc);
  }
}

template <int M>
void row_q4_k(const uint8_t* row, const Rows& x, __m256* acc, float* extra) {
  for (int64_t sb = 0; sb < x.nb / 8; ++sb) {
    const uint8_t* b = row + 144 * sb;
    prefetch(b);
    prefetch(b + 64);
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* s = b + 4;
    int sc[8], mn[8];
    for (int j = 0; j < 4; ++j) {
      sc[j] = s[j] & 63;
      mn[j] = s[j + 4] & 63;
      sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4);
      mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    for (int j = 0; j < 8; ++j) {
      const __m256i bytes = load32(b + 16 + 32 * (j / 2));
      const __m256i q = _mm256_and_si256(j % 2 == 0 ? bytes : _mm256_srli_epi16(bytes, 4),
                                         _mm256_set1_epi8(0x0F));
      const int64_t c = 8 * sb + j;
      accumulate<false, M>(x, c, q, d * float(sc[j]), acc);
      for (int i = 0; i < M; ++i) extra[i] -= dmin * float(mn[j]) * x.sx(i, c);
    }
  }
}

template <int M>
void row_q6_k(const uint8_t* row, const Rows& x, __m256* acc, float*) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), two_bits = _mm256_set1_epi8(3);
  for (int64_t sb = 0; sb < x.nb / 8; ++sb) {
    const uint8_t* b = row + 210 * sb;
    prefetch(b);
    prefetch(b + 64);
    prefetch(b + 128);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_at(b + 208);
    for (int j = 0; j < 8; ++j) {
      const int h = j / 4, r = j % 4;
      const __m256i lsrc = load32(b + 64 * h + 32 * (r & 1));
      const __m256i low = _mm256_and_si256(r < 2 ? lsrc : _mm256_srli_epi16(lsrc, 4), low4);
      const __m256i hsrc = load32(b + 128 + 32 * h);
      const __m256i high =
          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hsrc, 2 * r), two_bits), 4);
      const __m256i w = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
      const __m256i scales =
          _mm256_set_m128i(_mm_set1_epi16(sc[2 * j + 1]), _mm_set1_epi16(sc[2 * j]));
      const int64_t c = 8 * sb + j;
      for (int i = 0; i < M; ++i) {
        const __m256i s = dot_signed_scaled(w, load32(x.xq(i, c)), scales);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * x.dx(i, c)), acc[i]);
      }
    }
  }
}

// MLX affine, 4 or 8 bits: w = s·q + b, so Σ w x = s Σ q x + b Σ x; 8-bit codes are taken as
// q − 128 (signed), which moves 128 s into the bias term.
template <int Bits, int M>
void row_affine(const WeightMatrix& w, int64_t n, const Rows& x, __m256* acc, float* extra) {
  const AffineParams& a = w.affine;
  const int64_t groups = w.cols / a.group_size, per_group = a.group_size / 32;
  const uint8_t* codes = w.data + n * w.row_bytes();
  const uint8_t* scales = a.scales + n * groups * 2;
  const uint8_t* biases = a.biases + n * groups * 2;
  for (int64_t g = 0; g < groups; ++g) {
    const float s = scale_at(scales + 2 * g, a.scale_dtype);
    const float bias = scale_at(biases + 2 * g, a.scale_dtype) + (Bits == 8 ? 128.0f * s : 0.0f);
    for (int64_t j = 0; j < per_group; ++j) {
      const int64_t c = g * per_group + j;
      if (c % 2 == 0) prefetch(codes + Bits * 4 * c);
      if constexpr (Bits == 4) {
        accumulate<false, M>(x, c, unpack_nibbles16(codes + 16 * c), s, acc);
      } else {
        const __m256i q = _mm256_xor_si256(load32(codes + 32 * c), _mm256_set1_epi8(char(0x80)));
        accumulate<true, M>(x, c, q, s, acc);
      }
      for (int i = 0; i < M; ++i) extra[i] += bias * x.sx(i, c);
    }
  }
}

}  // namespace

bool qmatmul_supported(const WeightMatrix& w) {
  if (w.format == WeightFormat::kAffine) return w.affine.bits == 4 || w.affine.bits == 8;
  return w.format != WeightFormat::kDense;
}

namespace {

template <int M>
void rows_group(const Rows& x, const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                float* y) {
  const int64_t row_bytes = w.row_bytes();
  for (int64_t n = row_begin; n < row_end; ++n) {
    __m256 acc[M];
    float extra[M];
    for (int i = 0; i < M; ++i) {
      acc[i] = _mm256_setzero_ps();
      extra[i] = 0;
    }
    const uint8_t* row = w.data + n * row_bytes;
    switch (w.format) {
      case WeightFormat::kQ8_0:
        row_q8_0<M>(row, x, acc, extra);
        break;
      case WeightFormat::kQ4_0:
        row_q4_0<M>(row, x, acc, extra);
        break;
      case WeightFormat::kQ5_0:
        row_q5_0<M>(row, x, acc, extra);
        break;
      case WeightFormat::kQ4_K:
        row_q4_k<M>(row, x, acc, extra);
        break;
      case WeightFormat::kQ6_K:
        row_q6_k<M>(row, x, acc, extra);
        break;
      default:
        if (w.affine.bits == 4) {
          row_affine<4, M>(w, n, x, acc, extra);
        } else {
          row_affine<8, M>(w, n, x, acc, extra);
        }
        break;
    }
    for (int i = 0; i < M; ++i) y[i * w.rows + n] = hsum(acc[i]) + extra[i];
  }
}

}  // namespace

void qmatmul_rows(const ActivationBlocks& xb, const WeightMatrix& w, int64_t row_begin,
                  int64_t row_end, float* y) {
  const int64_t nb = xb.cols / 32;
  for (int64_t i0 = 0; i0 < xb.m; i0 += kMaxGroup) {
    const Rows x{xb.q.data() + i0 * xb.cols, xb.d.data() + i0 * nb, xb.dsum.data() + i0 * nb,
                 xb.cols, nb};
    float* yi = y + i0 * w.rows;
    switch (std::min<int64_t>(kMaxGroup, xb.m - i0)) {
      case 1:
        rows_group<1>(x, w, row_begin, row_end, yi);
        break;
      case 2:
        rows_group<2>(x, w, row_begin, row_end, yi);
        break;
      case 3:
        rows_group<3>(x, w, row_begin, row_end, yi);
        break;
      default:
        rows_group<4>(x, w, row_begin, row_end, yi);
        break;
    }
  }
}

}  // namespace turbokv::avx2
