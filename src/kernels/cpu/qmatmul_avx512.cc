// AVX-512 VNNI integer dot products of quantized weight rows (qweights.h) with int8 activation
// blocks. The unit of work is a *piece* of 64 consecutive values of a row: its weights are
// unpacked to 64 unsigned bytes u, and vpdpbusd sums u · x over each 4 bytes into 16 int32
// lanes (lane l holds values 4l..4l+3, so a 32-value activation block is 8 lanes). Formats
// whose codes are offset (Q4_0: q − 8, Q5_0: q − 16, Q6_K: q − 32, Q8_0: w + 128 − 128) start
// the lanes at −offset · Σ x of the lane (ActivationBlocks::sum4, shifted, since the offsets
// are powers of two), so each lane ends as the exact Σ w · x. The lanes are then converted and
// scaled by a per-lane weight scale × activation scale (d4) into f32 accumulators; the
// additive terms (Q4_K's −dmin·m, MLX biases) are products of per-32-block values with the
// activation blocks' sums (dsum), 8 or 16 blocks per instruction. Two or four weight rows share
// every activation load; up to 4 activation rows share every weight unpack. No int32 lane can
// overflow: |u| <= 255, |x| <= 127, and lanes are converted after every piece.
// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics (cvtepi32_ps,
// castsi256_si512, ...) as uninitialized once they are inlined here; they are not.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "kernels/cpu/qmatmul_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/cpu.h"
#include "core/half.h"

namespace turbokv::avx512 {
namespace {

constexpr int kMaxGroup = 4;  // activation rows per pass over the weights
constexpr int kRowsPerPass = 2;  // weight rows per pass (four for some formats, rows_group)
// Weight bytes requested ahead of each row stream. With 4-bit codes the loads are too sparse
// in time for the hardware prefetcher to keep enough of a DRAM stream in flight: on a 1.2B
// model this raised decode tokens per CPU-second by 1.3x (Q4_0) to 1.6x (MLX 4-bit).
constexpr int kPrefetchBytes = 4096;

inline void prefetch(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
}

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

// Lanes 0..7 a, lanes 8..15 b.
inline __m512 pair(float a, float b) {
  return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

// 16 bytes at p and 16 at q, each as 32 nibble values (low nibbles, then high ones):
// bytes 0..31 from p, 32..63 from q.
inline __m512i nibbles_2x16(const uint8_t* p, const uint8_t* q) {
  const __m256i v = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)),
                                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
  // [p lo, q lo, p hi, q hi] -> [p lo, p hi, q lo, q hi]
  const __m512i ordered = _mm512_shuffle_i64x2(both, both, _MM_SHUFFLE(3, 1, 2, 0));
  return _mm512_and_si512(ordered, _mm512_set1_epi8(0x0F));
}

// 32 bytes at p as 64 values: low nibbles of all 32 bytes, then the high ones.
inline __m512i nibbles_32(const uint8_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
  return _mm512_and_si512(both, _mm512_set1_epi8(0x0F));
}

inline __m512i load64(const void* p) {
  return _mm512_loadu_si512(p);
}

// The activation rows: piece p of row i is q + i * cols + 64 p; per-lane arrays at
// i * cols / 4 + 16 p.
struct Rows {
  const int8_t* q;
  const float* dsum;  // [m, cols / 32]
  const int32_t* sum4;
  const float* d4;
  int64_t cols;
  const int8_t* xq(int i, int64_t p) const { return q + i * cols + 64 * p; }
  int64_t lane(int i, int64_t p) const { return i * (cols / 4) + 16 * p; }
};

// The weights of one piece of each of the R rows: unsigned bytes and per-lane scales.
template <int R>
struct Piece {
  __m512i u[R];
  __m512 scale[R];
};

// acc[r][i] += Σ over the piece: lanes of dpbusd(−(sum4 << Shift), u, x) · scale · d4
// (Shift < 0: no offset).
template <int R, int M, int Shift>
inline void accumulate(const Rows& x, int64_t p, const Piece<R>& w, __m512 (&acc)[R][M]) {
  for (int i = 0; i < M; ++i) {
    const __m512i xi = load64(x.xq(i, p));
    const int64_t l = x.lane(i, p);
    __m512i init = _mm512_setzero_si512();
    if constexpr (Shift >= 0) {
      init = _mm512_sub_epi32(init, _mm512_slli_epi32(load64(x.sum4 + l), Shift));
    }
    const __m512 d = _mm512_loadu_ps(x.d4 + l);
    for (int r = 0; r < R; ++r) {
      const __m512i dot = _mm512_dpbusd_epi32(init, w.u[r], xi);
      acc[r][i] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w.scale[r], d), acc[r][i]);
    }
  }
}

// The f16 scales d (the first 2 bytes of each block) of `count` <= 16 consecutive blocks of
// BlockBytes from p, as floats (lanes past count are 0): one gather instead of a scalar load,
// conversion and broadcast per block.
template <int BlockBytes>
inline __m512 block_scales16(const uint8_t* p, int count) {
  const __m512i offsets = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      _mm512_set1_epi32(BlockBytes));
  const __m512i words = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(),
                                                    __mmask16((1u << count) - 1), offsets, p, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
}

// The formats of 32-value blocks led by an f16 scale (Q8_0, Q4_0, Q5_0): pieces in chunks of up
// to 8, the chunk's 16 scales gathered once and spread per piece by a permutation. unpack(b)
// gives the 64 unsigned codes of the two blocks at b.
template <int BlockBytes, int Shift, int R, int M, class Unpack>
void rows_blocks32(const uint8_t* const (&row)[R], const Rows& x, __m512 (&acc)[R][M],
                   Unpack unpack) {
  // Lane k of piece c: block 2c (k < 8) or 2c + 1 of the chunk.
  const __m512i half_sel = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const int64_t pieces = x.cols / 64;
  Piece<R> w;
  for (int64_t p0 = 0; p0 < pieces; p0 += 8) {
    const int chunk = int(std::min<int64_t>(8, pieces - p0));
    __m512 d[R];
    for (int r = 0; r < R; ++r) {
      d[r] = block_scales16<BlockBytes>(row[r] + 2 * BlockBytes * p0, 2 * chunk);
    }
    for (int c = 0; c < chunk; ++c) {
      const __m512i idx = _mm512_add_epi32(half_sel, _mm512_set1_epi32(2 * c));
      for (int r = 0; r < R; ++r) {
        prefetch(row[r] + 2 * BlockBytes * (p0 + c));
        w.u[r] = unpack(row[r] + 2 * BlockBytes * (p0 + c));
        w.scale[r] = _mm512_permutexvar_ps(idx, d[r]);
      }
      accumulate<R, M, Shift>(x, p0 + c, w, acc);
    }
  }
}

template <int R, int M>
void rows_q8_0(const uint8_t* const (&row)[R], const Rows& x, __m512 (&acc)[R][M]) {
  rows_blocks32<34, 7>(row, x, acc, [](const uint8_t* b) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 36));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return _mm512_xor_si512(v, _mm512_set1_epi8(char(0x80)));  // w + 128
  });
}

template <int R, int M>
void rows_q4_0(const uint8_t* const (&row)[R], const Rows& x, __m512 (&acc)[R][M]) {
  rows_blocks32<18, 3>(row, x, acc, [](const uint8_t* b) { return nibbles_2x16(b + 2, b + 20); });
}

template <int R, int M>
void rows_q5_0(const uint8_t* const (&row)[R], const Rows& x, __m512 (&acc)[R][M]) {
  rows_blocks32<22, 4>(row, x, acc, [](const uint8_t* b) {
    uint32_t h0, h1;
    std::memcpy(&h0, b + 2, 4);
    std::memcpy(&h1, b + 24, 4);
    const __mmask64 high = _cvtu64_mask64(uint64_t(h0) | (uint64_t(h1) << 32));
    const __m512i q = nibbles_2x16(b + 6, b + 28);
    return _mm512_mask_add_epi8(q, high, q, _mm512_set1_epi8(0x10));
  });
}

// The 8 sub-block scales and mins of a Q4_K super-block (6 bits each in 12 bytes) as int32s.
inline void q4_k_scales(const uint8_t* s, __m256i* sc, __m256i* mn) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t low6 = 0x3F3F3F3Fu, low4 = 0x0F0F0F0Fu, top2 = 0x03030303u;
  const uint32_t sc_lo = u[0] & low6, mn_lo = u[1] & low6;
  const uint32_t sc_hi = (u[2] & low4) | (((u[0] >> 6) & top2) << 4);
  const uint32_t mn_hi = ((u[2] >> 4) & low4) | (((u[1] >> 6) & top2) << 4);
  *sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(sc_lo) | (int64_t(sc_hi) << 32)));
  *mn = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(mn_lo) | (int64_t(mn_hi) << 32)));
}

// Q4_K: the mins' term −dmin · Σ_j m_j · Σ x over sub-block j is one 8-wide product per
// super-block with the activation blocks' sums (dsum), kept in its own accumulators.
template <int R, int M>
void rows_q4_k(const uint8_t* const (&row)[R], const Rows& x, __m512 (&acc)[R][M]) {
  Piece<R> w;
  __m256 min_acc[R][M];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) min_acc[r][i] = _mm256_setzero_ps();
  }
  // Lane k of piece c: sub-block 2c (k < 8) or 2c + 1.
  const __m512i half_sel = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int64_t sb = 0; sb < x.cols / 256; ++sb) {
    __m512 scales[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = row[r] + 144 * sb;
      __m256i sc, mn;
      q4_k_scales(b + 4, &sc, &mn);
      scales[r] = _mm512_castps256_ps512(
          _mm256_mul_ps(_mm256_cvtepi32_ps(sc), _mm256_set1_ps(half_at(b))));
      const __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(mn), _mm256_set1_ps(half_at(b + 2)));
      for (int i = 0; i < M; ++i) {
        const __m256 sums = _mm256_loadu_ps(x.dsum + i * (x.cols / 32) + 8 * sb);
        min_acc[r][i] = _mm256_fnmadd_ps(mins, sums, min_acc[r][i]);
      }
    }
    for (int c = 0; c < 4; ++c) {
      const __m512i idx = _mm512_add_epi32(half_sel, _mm512_set1_epi32(2 * c));
      for (int r = 0; r < R; ++r) {
        prefetch(row[r] + 144 * sb + 36 * c);
        w.u[r] = nibbles_32(row[r] + 144 * sb + 16 + 32 * c);
        w.scale[r] = _mm512_permutexvar_ps(idx, scales[r]);
      }
      accumulate<R, M, -1>(x, 4 * sb + c, w, acc);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) {
      acc[r][i] = _mm512_add_ps(acc[r][i], _mm512_castps256_ps512(min_acc[r][i]));
    }
  }
}

template <int R, int M>
void rows_q6_k(const uint8_t* const (&row)[R], const Rows& x, __m512 (&acc)[R][M]) {
  Piece<R> w;
  const __m512i low4 = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
  const __m512i lane_sub = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  for (int64_t sb = 0; sb < x.cols / 256; ++sb) {
    __m512 scales[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = row[r] + 210 * sb;
      const __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
      scales[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(half_at(b + 208)));
    }
    for (int piece = 0; piece < 4; ++piece) {  // values 64 piece .. 64 piece + 63
      const int h = piece / 2, rr = piece % 2;
      const __m512i idx = _mm512_add_epi32(lane_sub, _mm512_set1_epi32(4 * piece));
      for (int r = 0; r < R; ++r) {
        const uint8_t* b = row[r] + 210 * sb;
        prefetch(b + 52 * piece);
        const __m512i ql = load64(b + 64 * h);
        const __m512i low = _mm512_and_si512(rr == 0 ? ql : _mm512_srli_epi16(ql, 4), low4);
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
        const __m512i hsrc =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(qh, 4 * rr)),
                               _mm256_srli_epi16(qh, 4 * rr + 2), 1);
        const __m512i high = _mm512_slli_epi16(_mm512_and_si512(hsrc, two), 4);
        w.u[r] = _mm512_or_si512(low, high);
        w.scale[r] = _mm512_permutexvar_ps(idx, scales[r]);
      }
      accumulate<R, M, 5>(x, 4 * sb + piece, w, acc);
    }
  }
}

// 16 scales or biases (f16 or bf16) at p as floats; lanes past `count` are 0.
inline __m512 load_scales16(const uint8_t* p, int count, DType dtype) {
  const __m256i h = _mm256_maskz_loadu_epi16(__mmask16((1u << count) - 1), p);
  if (dtype == DType::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// MLX affine, 4 or 8 bits: w = s·q + b with q unsigned, so Σ w x = s Σ q x + b Σ x. The rows
// go in chunks of up to 8 pieces (512 values): the chunk's scales and biases are converted
// once, each piece's per-lane scales are a permutation of them, and the bias term of the chunk
// is one product of the biases spread per 32-block with the activation blocks' sums (dsum).
template <int Bits, int R, int M>
void rows_affine(const WeightMatrix& wm, const int64_t (&n)[R], const Rows& x,
                 __m512 (&acc)[R][M]) {
  const AffineParams& a = wm.affine;
  const int64_t groups = wm.cols / a.group_size, row_bytes = wm.row_bytes();
  const int shift = a.group_size == 32 ? 5 : a.group_size == 64 ? 6 : 7;
  const __m512i lane_col = _mm512_set_epi32(60, 56, 52, 48, 44, 40, 36, 32, 28, 24, 20, 16, 12,
                                            8, 4, 0);  // first column of lane k in a piece
  const __m512i block_col = _mm512_slli_epi32(lane_col, 3);  // 32 k: block k of a chunk
  const uint8_t* codes[R];
  const uint8_t* scales[R];
  const uint8_t* biases[R];
  for (int r = 0; r < R; ++r) {
    codes[r] = wm.data + n[r] * row_bytes;
    scales[r] = a.scales + n[r] * groups * 2;
    biases[r] = a.biases + n[r] * groups * 2;
  }
  __m512 bias_acc[R][M];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) bias_acc[r][i] = _mm512_setzero_ps();
  }
  Piece<R> w;
  const int64_t pieces = x.cols / 64;
  for (int64_t p0 = 0; p0 < pieces; p0 += 8) {
    const int chunk = int(std::min<int64_t>(8, pieces - p0));  // pieces in this chunk
    const int64_t g0 = 64 * p0 >> shift;                        // first group of the chunk
    const int ng = std::max(1, (64 * chunk) >> shift);
    __m512 sv[R], bv[R];
    for (int r = 0; r < R; ++r) {
      sv[r] = load_scales16(scales[r] + 2 * g0, ng, a.scale_dtype);
      bv[r] = load_scales16(biases[r] + 2 * g0, ng, a.scale_dtype);
    }
    // Bias term: block k of the chunk has group (32 k) >> shift.
    const __m512i block_group = _mm512_srli_epi32(block_col, shift);
    const __mmask16 blocks = __mmask16((1u << (2 * chunk)) - 1);
    for (int i = 0; i < M; ++i) {
      const __m512 sums = _mm512_maskz_loadu_ps(blocks, x.dsum + i * (x.cols / 32) + 2 * p0);
      for (int r = 0; r < R; ++r) {
        bias_acc[r][i] =
            _mm512_fmadd_ps(_mm512_permutexvar_ps(block_group, bv[r]), sums, bias_acc[r][i]);
      }
    }
    for (int c = 0; c < chunk; ++c) {
      const int64_t p = p0 + c;
      const __m512i idx = _mm512_srli_epi32(_mm512_add_epi32(lane_col, _mm512_set1_epi32(64 * c)),
                                            shift);
      for (int r = 0; r < R; ++r) {
        prefetch(codes[r] + Bits * 8 * p);
        if constexpr (Bits == 4) {
          w.u[r] = nibbles_2x16(codes[r] + 32 * p, codes[r] + 32 * p + 16);
        } else {
          w.u[r] = load64(codes[r] + 64 * p);
        }
        w.scale[r] = _mm512_permutexvar_ps(idx, sv[r]);
      }
      accumulate<R, M, -1>(x, p, w, acc);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) acc[r][i] = _mm512_add_ps(acc[r][i], bias_acc[r][i]);
  }
}

template <int R, int M>
void rows_pass(const Rows& x, const WeightMatrix& w, int64_t row_bytes, const int64_t (&n)[R],
               float* y) {
  __m512 acc[R][M];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  const uint8_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = w.data + n[r] * row_bytes;
  switch (w.format) {
    case WeightFormat::kQ8_0:
      rows_q8_0<R, M>(row, x, acc);
      break;
    case WeightFormat::kQ4_0:
      rows_q4_0<R, M>(row, x, acc);
      break;
    case WeightFormat::kQ5_0:
      rows_q5_0<R, M>(row, x, acc);
      break;
    case WeightFormat::kQ4_K:
      rows_q4_k<R, M>(row, x, acc);
      break;
    case WeightFormat::kQ6_K:
      rows_q6_k<R, M>(row, x, acc);
      break;
    default:
      if (w.affine.bits == 4) {
        rows_affine<4, R, M>(w, n, x, acc);
      } else {
        rows_affine<8, R, M>(w, n, x, acc);
      }
      break;
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) y[i * w.rows + n[r]] = _mm512_reduce_add_ps(acc[r][i]);
  }
}

template <int M>
void rows_group(const Rows& x, const WeightMatrix& w, int64_t row_begin, int64_t row_end,
                float* y) {
  const int64_t row_bytes = w.row_bytes();
  int64_t n = row_begin;
  // Four weight rows per pass for one or two activation rows where it measured faster
  // (bench_qmatmul: Q4_0, Q5_0, Q4_K, MLX 4-bit); Q6_K and 8-bit codes keep two (registers).
  const bool four = w.format == WeightFormat::kQ4_0 || w.format == WeightFormat::kQ5_0 ||
                    w.format == WeightFormat::kQ4_K ||
                    (w.format == WeightFormat::kAffine && w.affine.bits == 4);
  if constexpr (M <= 2) {
    if (four) {
      for (; n + 4 <= row_end; n += 4) {
        const int64_t rows[4] = {n, n + 1, n + 2, n + 3};
        rows_pass<4, M>(x, w, row_bytes, rows, y);
      }
    }
  }
  for (; n + kRowsPerPass <= row_end; n += kRowsPerPass) {
    const int64_t rows[kRowsPerPass] = {n, n + 1};
    rows_pass<kRowsPerPass, M>(x, w, row_bytes, rows, y);
  }
  if (n < row_end) {
    const int64_t rows[1] = {n};
    rows_pass<1, M>(x, w, row_bytes, rows, y);
  }
}

}  // namespace

bool qmatmul_vnni_available() {
  static const bool has = [] {
#if defined(__x86_64__) || defined(_M_X64)
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
  }();
  return has;
}

bool qmatmul_supported(const WeightMatrix& w) {
  if (w.cols % 64 != 0) return false;
  if (w.format == WeightFormat::kAffine) return w.affine.bits == 4 || w.affine.bits == 8;
  return w.format != WeightFormat::kDense;
}

void qmatmul_rows(const ActivationBlocks& xb, const WeightMatrix& w, int64_t row_begin,
                  int64_t row_end, float* y) {
  const int64_t lanes = xb.cols / 4;
  for (int64_t i0 = 0; i0 < xb.m; i0 += kMaxGroup) {
    const Rows x{xb.q.data() + i0 * xb.cols, xb.dsum.data() + i0 * (xb.cols / 32),
                 xb.sum4.data() + i0 * lanes,
                 xb.d4.data() + i0 * lanes, xb.cols};
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

}  // namespace turbokv::avx512
