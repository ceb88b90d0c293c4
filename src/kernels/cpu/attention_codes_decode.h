// Decode attention on TurboQuant codes: the work item of one query (attend_split_k) for a KV
// head whose keys and values are each one MSE segment of 1..4 bits with head_dim % 8 == 0
// (VectorDecoder::fusable). The G query heads of the KV head go through each block of keys
// together, up to kMaxDecodeRows at a time, so every code is read and looked up once for all
// of them. Per block of kDecodeBlock keys:
//   1. scores: a group of 8 key codes is one 32-bit broadcast load and one vpsrlvd; the codebook
//      lookup runs in registers (Lookup) and feeds the fp32 multiply-adds of every row; the
//      partial sums of TT tokens x R rows are reduced together by one hadd tree;
//   2. per row, s = scale * key norm * score (soft-capped); the online softmax {m, l, acc} takes
//      the block, acc rescaled only when the row's max grows; w = exp(s - m) * value norm;
//   3. values: each looked-up group of 8 value centroids feeds the multiply-adds of every row,
//      R x CG accumulators held in registers over the block.
// Two kinds of products (code_products(), attention_codes.h):
//   exact: fp32 multiply-adds on the exact codebook values, as above, so the result equals
//     the reference on the dequantized cache up to float rounding (the tile path's tolerance);
//   int8 (the default): tensors of 2, 3 or 4 bits with head_dim % 64 == 0 (int8_eligible) are
//     looked up as bytes and multiplied in 8 bits (below, "8-bit products"); steps 1 and 3
//     become integer dot products, step 2 is unchanged. 1-bit tensors stay exact.
// Other codecs (split k + 0.5 bits, more than 4 bits, head_dim % 8 != 0) take the tile path of
// attention_core.h.
//
// Lookup is the instruction-set part, a struct with
//   static constexpr int kRegisters: vector registers of the instruction set (16 or 32);
//   template <int B> static __m256 group(const uint8_t* p, const CodeTable& table):
//     the centroids of the 8 codes of B bits starting at p.
// Avx2Lookup is here; attention_codes_avx512.cc adds its own. Include only from translation
// units compiled with AVX2/FMA/F16C or more.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention_codes_core.h"
#include "kernels/cpu/attention_isa_avx2.h"

// Internal linkage on purpose: every ISA's translation unit compiles these templates and
// inline helpers with its own flags, and must not share one copy with another.
namespace turbokv::attention_detail {
namespace {

constexpr int kDecodeBlock = 32;   // keys per block
constexpr int kMaxDecodeRows = 8;  // query rows per pass over a block

// A codebook of up to 16 centroids in registers, and the per-lane shifts that bring code j of
// a group to bits 0..B-1 of lane j. vpermps reads index bits 0-2 only; for B < 3 the table
// repeats the 2^B centroids, so the bits of the next codes above a code select a copy and need
// no masking. For B = 4, high holds centroids 8-15 (bit 3 picks it) and flip their bitwise
// XOR with centroids 0-7 (for a select without vblendvps).
struct CodeTable {
  __m256 low, high, flip;
  __m256i shifts;
};

inline CodeTable make_code_table(const float* centroids, int bits) {
  alignas(32) float low[8];
  const int n = 1 << std::min(bits, 3);
  for (int i = 0; i < 8; ++i) low[i] = centroids[i % n];
  CodeTable table;
  table.low = _mm256_load_ps(low);
  table.high = bits == 4 ? _mm256_loadu_ps(centroids + 8) : _mm256_setzero_ps();
  table.flip = _mm256_xor_ps(table.low, table.high);
  table.shifts =
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits));
  return table;
}

// The 4 bytes at p (where a group of 8 codes starts; storage keeps 4 bytes of padding after
// the last vector) broadcast to all 8 lanes with one load, shifted so that lane j holds code j
// in its low bits.
inline __m256i group_indices(const uint8_t* p, __m256i shifts) {
  int32_t word;
  std::memcpy(&word, p, sizeof(word));
  return _mm256_srlv_epi32(_mm256_set1_epi32(word), shifts);
}

// AVX2: one vpermps per group. 16 centroids: low[idx] ^ (flip[idx] & (bit 3 set)), two
// vpermps and bitwise operations; vblendvps (and a shift to the sign bit) would take the
// multiply-add ports and a shuffle port on AMD Zen, vpand / vpcmpeqd / vxorps take neither.
struct Avx2Lookup {
  static constexpr int kRegisters = 16;

  template <int B>
  static __m256 group(const uint8_t* p, const CodeTable& table) {
    const __m256i idx = group_indices(p, table.shifts);
    const __m256 c = _mm256_permutevar8x32_ps(table.low, idx);
    if constexpr (B < 4) return c;
    const __m256 flip = _mm256_permutevar8x32_ps(table.flip, idx);
    const __m256i bit3 = _mm256_set1_epi32(8);
    const __m256i high = _mm256_cmpeq_epi32(_mm256_and_si256(idx, bit3), bit3);
    return _mm256_xor_ps(c, _mm256_and_ps(flip, _mm256_castsi256_ps(high)));
  }
};

// An empty asm that makes x opaque: the compiler keeps it in a register instead of reloading
// it from memory at every use (with 16 vector registers GCC otherwise folds the query loads
// into each multiply-add, and the loads, not the multiply-adds, bound the score loop).
__attribute__((always_inline)) inline void keep_in_register(__m256& x) {
#if defined(__AVX512VL__)
  asm("" : "+v"(x));
#else
  asm("" : "+x"(x));
#endif
}

// The largest power of two s <= max with registers_used(s) <= registers.
constexpr int largest_span(int max, int registers, int (*registers_used)(int, int), int rows) {
  int s = max;
  while (s > 1 && registers_used(s, rows) > registers) s /= 2;
  return s;
}
// Keys per step of the score kernel for R rows: R x TT accumulators, TT looked-up groups,
// the query vector, the table and the shifts in registers.
template <class Lookup, int R>
constexpr int kScoreSpan = largest_span(
    8, Lookup::kRegisters, [](int tt, int rows) { return rows * tt + tt + 3; }, R);
// Groups of 8 columns per pass of the value kernel: R x CG accumulators, the weights of the
// rows (or the looked-up groups, whichever is fewer), tables, shifts and lookup temporaries.
template <class Lookup, int R>
constexpr int kValueSpan = largest_span(
    16, Lookup::kRegisters, [](int cg, int rows) { return rows * cg + std::min(cg, rows) + 5; }, R);

// a[I], or zero past the end. Accumulator arrays are only indexed by constants (after
// unrolling) and never passed by pointer, so GCC keeps them in registers.
template <int I, int K>
__attribute__((always_inline)) inline __m256 acc_at(const __m256 (&a)[K]) {
  if constexpr (I < K) {
    return a[I];
  } else {
    return _mm256_setzero_ps();
  }
}

// The sums of a[C], ..., a[C + 7] (zero past K) as the 8 lanes of one vector: one hadd tree.
template <int C, int K>
__attribute__((always_inline)) inline __m256 lane_sums(const __m256 (&a)[K]) {
  const __m256 k01 = _mm256_hadd_ps(_mm256_hadd_ps(acc_at<C, K>(a), acc_at<C + 1, K>(a)),
                                    _mm256_hadd_ps(acc_at<C + 2, K>(a), acc_at<C + 3, K>(a)));
  if constexpr (K - C <= 4) {  // [a0 a1 a2 a3 | a0' a1' a2' a3']: the halves added
    return _mm256_castps128_ps256(
        _mm_add_ps(_mm256_castps256_ps128(k01), _mm256_extractf128_ps(k01, 1)));
  } else {
    const __m256 k23 = _mm256_hadd_ps(_mm256_hadd_ps(acc_at<C + 4, K>(a), acc_at<C + 5, K>(a)),
                                      _mm256_hadd_ps(acc_at<C + 6, K>(a), acc_at<C + 7, K>(a)));
    return _mm256_add_ps(_mm256_permute2f128_ps(k01, k23, 0x20),
                         _mm256_permute2f128_ps(k01, k23, 0x31));
  }
}

// scores[r * kDecodeBlock + u] = the sum of a[r * TT + u] for r < R, u < TT: one tree per 8
// accumulators (whole runs of TT tokens of a row), stored a run at a time.
template <int R, int TT, int C = 0>
__attribute__((always_inline)) inline void store_score_sums(const __m256 (&a)[R * TT],
                                                            float* scores) {
  constexpr int K = R * TT;
  if constexpr (C < K) {
    constexpr int KC = std::min(K - C, 8);
    const __m256 sums = lane_sums<C, K>(a);
    const __m128 low = _mm256_castps256_ps128(sums), high = _mm256_extractf128_ps(sums, 1);
    float* row = scores + (C / TT) * kDecodeBlock;  // first row of the chunk
    if constexpr (TT == 8) {
      _mm256_storeu_ps(row, sums);
    } else if constexpr (TT == 4) {
      _mm_storeu_ps(row, low);
      if constexpr (KC > 4) _mm_storeu_ps(row + kDecodeBlock, high);
    } else if constexpr (TT == 2) {
      _mm_storel_pi(reinterpret_cast<__m64*>(row), low);
      if constexpr (KC > 2) _mm_storeh_pi(reinterpret_cast<__m64*>(row + kDecodeBlock), low);
      if constexpr (KC > 4) _mm_storel_pi(reinterpret_cast<__m64*>(row + 2 * kDecodeBlock), high);
      if constexpr (KC > 6) _mm_storeh_pi(reinterpret_cast<__m64*>(row + 3 * kDecodeBlock), high);
    } else {
      row[0] = _mm_cvtss_f32(low);
      if constexpr (KC > 1) row[kDecodeBlock] = _mm_cvtss_f32(_mm_movehdup_ps(low));
      if constexpr (KC > 2) row[2 * kDecodeBlock] = _mm_cvtss_f32(_mm_movehl_ps(low, low));
      if constexpr (KC > 3) {
        row[3 * kDecodeBlock] = _mm_cvtss_f32(_mm_shuffle_ps(low, low, 3));
      }
      if constexpr (KC > 4) row[4 * kDecodeBlock] = _mm_cvtss_f32(high);
      if constexpr (KC > 5) row[5 * kDecodeBlock] = _mm_cvtss_f32(_mm_movehdup_ps(high));
      if constexpr (KC > 6) row[6 * kDecodeBlock] = _mm_cvtss_f32(_mm_movehl_ps(high, high));
      if constexpr (KC > 7) {
        row[7 * kDecodeBlock] = _mm_cvtss_f32(_mm_shuffle_ps(high, high, 3));
      }
    }
    store_score_sums<R, TT, C + 8>(a, scores);
  }
}

// scores[r][t] = <q_r, centroids of key t> for r < R, t in [t, n), TT keys per step; returns
// the first key not done (n - (n - t) % TT).
// always_inline: a standalone copy would keep the accumulators in a stack array (GCC 12
// stores every one of them on each iteration).
template <class Lookup, int B, int R, int TT, int D>
__attribute__((always_inline)) inline int score_keys(const CodeTable& table, const uint8_t* codes,
                                                     size_t stride, const float* q, int d_runtime,
                                                     int t, int n, float* scores) {
  const int d = D > 0 ? D : d_runtime;
  const int groups = d / 8;
  for (; t + TT <= n; t += TT) {
    const uint8_t* c = codes + t * stride;
    __m256 a[R * TT];
    for (auto& x : a) x = _mm256_setzero_ps();
    for (int g = 0; g < groups; ++g) {
      __m256 x[TT];
      for (int u = 0; u < TT; ++u) x[u] = Lookup::template group<B>(c + u * stride + g * B, table);
      for (int r = 0; r < R; ++r) {
        __m256 qv = _mm256_loadu_ps(q + r * d + 8 * g);
        keep_in_register(qv);  // one load for the TT keys, not one per multiply-add
        for (int u = 0; u < TT; ++u) a[r * TT + u] = _mm256_fmadd_ps(qv, x[u], a[r * TT + u]);
      }
    }
    store_score_sums<R, TT>(a, scores + t);
  }
  return t;
}

template <class Lookup, int B, int R, int D>
inline void score_block(const CodeTable& table, const uint8_t* codes, size_t stride, const float* q,
                        int d, int n, float* scores) {
  constexpr int TT = kScoreSpan<Lookup, R>;
  const int t = score_keys<Lookup, B, R, TT, D>(table, codes, stride, q, d, 0, n, scores);
  if constexpr (TT > 1) score_keys<Lookup, B, R, 1, D>(table, codes, stride, q, d, t, n, scores);
}

// acc[r][8 g0, 8 (g0 + CG)) += sum_{t < n} w[r][t] * centroids of value t, for r < R.
template <class Lookup, int B, int R, int CG, int D>
__attribute__((always_inline)) inline void accumulate_groups(const CodeTable& table,
                                                             const uint8_t* codes, size_t stride,
                                                             const float* w, int d_runtime, int g0,
                                                             int n, float* acc) {
  const int d = D > 0 ? D : d_runtime;
  __m256 a[R * CG];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < CG; ++j) a[r * CG + j] = _mm256_loadu_ps(acc + r * d + 8 * (g0 + j));
  }
  for (int t = 0; t < n; ++t) {
    const uint8_t* c = codes + t * stride + g0 * B;
    __m256 x[CG];
    for (int j = 0; j < CG; ++j) x[j] = Lookup::template group<B>(c + j * B, table);
    for (int r = 0; r < R; ++r) {
      const __m256 wt = _mm256_broadcast_ss(w + r * kDecodeBlock + t);
      for (int j = 0; j < CG; ++j) a[r * CG + j] = _mm256_fmadd_ps(wt, x[j], a[r * CG + j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < CG; ++j) _mm256_storeu_ps(acc + r * d + 8 * (g0 + j), a[r * CG + j]);
  }
}

template <class Lookup, int B, int R, int D>
inline void accumulate_block(const CodeTable& table, const uint8_t* codes, size_t stride,
                             const float* w, int d_runtime, int n, float* acc) {
  constexpr int CG = kValueSpan<Lookup, R>;
  const int d = D > 0 ? D : d_runtime;
  const int groups = d / 8;
  int g = 0;
  for (; g + CG <= groups; g += CG) {
    accumulate_groups<Lookup, B, R, CG, D>(table, codes, stride, w, d, g, n, acc);
  }
  if constexpr (D == 0 || (D / 8) % CG != 0) {
    for (; g < groups; ++g) {
      accumulate_groups<Lookup, B, R, 1, D>(table, codes, stride, w, d, g, n, acc);
    }
  }
}

// Calls fn.template operator()<R>() for rows in 1..kMaxDecodeRows.
template <class Fn>
void dispatch_rows(int rows, Fn&& fn) {
  switch (rows) {
    case 1:
      return fn.template operator()<1>();
    case 2:
      return fn.template operator()<2>();
    case 3:
      return fn.template operator()<3>();
    case 4:
      return fn.template operator()<4>();
    case 5:
      return fn.template operator()<5>();
    case 6:
      return fn.template operator()<6>();
    case 7:
      return fn.template operator()<7>();
    default:
      return fn.template operator()<8>();
  }
}

// Calls fn.template operator()<B, R>() for bits in 1..4 and rows in 1..kMaxDecodeRows.
template <class Fn>
void dispatch_decode(int bits, int rows, Fn&& fn) {
  auto with_rows = [&]<int B>() {
    return dispatch_rows(rows, [&]<int R>() { return fn.template operator()<B, R>(); });
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

// The largest of the 8 lanes of v.
inline float max_lanes(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

// Rows r0 .. r0 + R - 1 of the block (scores and w: [R][kDecodeBlock]): s = scores * key_scale
// (soft-capped; -inf past n), folded into the online softmax of each state row; w = exp(s - m) *
// value_scale; acc of a row rescaled when its max grows. The rows go through each step together,
// so their reductions and exps overlap instead of forming one dependency chain per row.
template <int R>
__attribute__((always_inline)) inline void softmax_block_rows(float* scores,
                                                              const float* key_scale,
                                                              const float* value_scale, int n,
                                                              float softcap, SoftmaxStates& state,
                                                              int r0, float* w) {
  constexpr int kVectors = kDecodeBlock / 8;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (softcap > 0) {
    for (int r = 0; r < R; ++r) {
      float* x = scores + r * kDecodeBlock;
      for (int t = 0; t < n; ++t) x[t] = softcap * std::tanh(x[t] * key_scale[t] / softcap);
    }
  }
  __m256 s[R][kVectors];
  float new_max[R];
  for (int r = 0; r < R; ++r) {
    const float* x = scores + r * kDecodeBlock;
    for (int i = 0; i < kVectors; ++i) {
      s[r][i] = softcap > 0 ? _mm256_loadu_ps(x + 8 * i)
                            : _mm256_mul_ps(_mm256_loadu_ps(x + 8 * i),
                                            _mm256_loadu_ps(key_scale + 8 * i));
    }
    if (n < kDecodeBlock) {  // the last block: keys past n do not exist
      const __m256 lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
      for (int i = 0; i < kVectors; ++i) {
        const __m256 past = _mm256_cmp_ps(_mm256_add_ps(lanes, _mm256_set1_ps(float(8 * i))),
                                          _mm256_set1_ps(float(n)), _CMP_GE_OQ);
        s[r][i] = _mm256_blendv_ps(s[r][i], _mm256_set1_ps(neg_inf), past);
      }
    }
    __m256 block_max = s[r][0];
    for (int i = 1; i < kVectors; ++i) block_max = _mm256_max_ps(block_max, s[r][i]);
    new_max[r] = max_lanes(block_max);
  }
  for (int r = 0; r < R; ++r) {
    float& m = state.m[r0 + r];
    if (new_max[r] > m) {
      if (m != neg_inf) {  // rescale what the row holds (nothing before its first key)
        const float alpha = std::exp(m - new_max[r]);
        state.l[r0 + r] *= alpha;
        float* acc = &state.acc[static_cast<size_t>(r0 + r) * state.d];
        const __m256 va = _mm256_set1_ps(alpha);
        for (int c = 0; c < state.d; c += 8) {
          _mm256_storeu_ps(acc + c, _mm256_mul_ps(_mm256_loadu_ps(acc + c), va));
        }
      }
      m = new_max[r];
    }
  }
  __m256 sum[R];
  for (int r = 0; r < R; ++r) {
    const __m256 shift = _mm256_set1_ps(state.m[r0 + r]);
    sum[r] = _mm256_setzero_ps();
    for (int i = 0; i < kVectors; ++i) {
      const __m256 p = avx2::exp8_flush_underflow(_mm256_sub_ps(s[r][i], shift));
      sum[r] = _mm256_add_ps(sum[r], p);
      _mm256_storeu_ps(w + r * kDecodeBlock + 8 * i,
                       _mm256_mul_ps(p, _mm256_loadu_ps(value_scale + 8 * i)));
    }
  }
  for (int r = 0; r < R; ++r) state.l[r0 + r] += Avx2Isa::hsum(sum[r]);
}

// One tensor of one KV head as the decode kernel reads it.
struct DecodeTensor {
  const uint8_t* codes = nullptr;   // [tokens, code_bytes], token 0 of the head
  const uint16_t* norms = nullptr;  // [tokens]
  size_t code_bytes = 0;
  int bits = 0;
  CodeTable table;
};

inline DecodeTensor make_decode_tensor(const CodedTensorView& view, const VectorDecoder& decoder,
                                       int64_t head_row) {
  DecodeTensor tensor;
  tensor.codes = view.codes + head_row * decoder.code_bytes;
  tensor.norms = view.norms + head_row;
  tensor.code_bytes = decoder.code_bytes;
  tensor.bits = decoder.segments[0].bits;
  tensor.table = make_code_table(decoder.segments[0].centroids, tensor.bits);
  return tensor;
}

// out[t] = norms[t] * scale for t < n, 0 up to kDecodeBlock.
inline void decode_norms(const uint16_t* norms, int n, float scale, float* out) {
  int t = 0;
  const __m256 vs = _mm256_set1_ps(scale);
  for (; t + 8 <= n; t += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(norms + t));
    _mm256_storeu_ps(out + t, _mm256_mul_ps(_mm256_cvtph_ps(h), vs));
  }
  for (; t < n; ++t) out[t] = _cvtsh_ss(norms[t]) * scale;
  for (; t < kDecodeBlock; ++t) out[t] = 0.0f;
}

// 8-bit products for 2-, 3- and 4-bit codebooks (CodeProducts::kInt8). A centroid is
// c_scale * c8 with |c8| <= kCentroidMax. Per token, the codes are expanded to one byte per
// coordinate and looked up by vpshufb, 32 at a time, in a storage order of the bits
// (storage_coordinate):
//   4 bits: a 32-byte run h of codes gives two vectors, the low nibbles (coordinates
//     64 h + 2 p) and the high ones (64 h + 2 p + 1);
//   3 bits: 12 bytes give one vector of 32 codes, one per 16-bit word in two vectors first
//     (codes j and j + 8 share a dword and its shift), then packed to bytes;
//   2 bits: 16 bytes u give two vectors, fields 0 and 1 of each byte i in the low and high
//     128-bit lane of the first (coordinates 64 u + 4 i + lane), fields 2 and 3 in the second
//     (64 u + 4 i + 2 + lane).
// Keys: sum_j (c8 + kKeyOffset) * q7[j] (the offset centroid is vpmaddubsw's unsigned operand,
//   the query rounded to 7 bits, |q7| <= 63, the signed one), minus kKeyOffset * sum_j q7[j];
//   the score is q_scale * c_scale times that.
// Values: per block, w8 = round(127 * w / max w) per row, and sum_t w8[t] * c8[t][j] over 4
//   tokens per 32-bit lane (4 tokens' c8 interleaved byte by byte), added to the fp32 sums with
//   the scale max w / 127 * c_scale once per block; the sums stay in the interleaved order
//   (value_coordinate) until the item ends.
// With AVX-512 VNNI one vpdpbusd sums 4 products into 32 bits: 8-bit centroids (|c8| <= 127,
// key offset 128). Without it, vpmaddubsw's 16-bit pair sums are widened by vpmaddwd, the
// multiply ports bound the kernel, and 7-bit centroids (|c8| <= 63, key offset 64) keep two
// pair sums within 16 bits (keys: 2 * 2 * 127 * 63, values: 2 * 2 * 127 * 63 < 2^15), so one
// vpmaddwd widens two vpmaddubsw: 25% fewer multiplies, measured 3-5% faster per tensor, at
// about 1.2x the rounding error (turboquant_decode_test).
// Queries are put in storage order once per item.
#if defined(__AVX512VNNI__)
constexpr int kCentroidMax = 127, kKeyOffset = 128;
#else
constexpr int kCentroidMax = 63, kKeyOffset = 64;
#endif
constexpr int kInt8MaxDim = 256;  // head_dim % 64 == 0 and <= 256
constexpr int kInt8MaxRows = 16;  // query rows of one KV head
constexpr int kQ7 = 63;           // largest |q7|

// Which tensors take the 8-bit products: keys and values of 2, 3 or 4 bits. 2-bit keys: K2/V3
// 2.61x vs 2.18x dense exact at 16k on AVX2 (bench attention, same run). 3-bit values, since
// their expansion takes 8 operations per 32 codes: K2/V3 2.54-2.60x against 2.25-2.38x with
// them exact, K4/V3 2.39-2.59x against 2.25-2.34x, at 16k and 64k on AVX2 (alternating runs).
inline bool int8_eligible(int bits, int d, int rows) {
  if (d % 64 != 0 || d > kInt8MaxDim || rows > kInt8MaxRows) return false;
  return bits == 2 || bits == 3 || bits == 4;
}

// Coordinate of byte p (0..31) of vector v of a token's expanded codes.
inline int storage_coordinate(int bits, int v, int p) {
  if (bits == 4) return 64 * (v / 2) + 2 * p + v % 2;
  if (bits == 2) return 64 * (v / 2) + 4 * (p % 16) + 2 * (v % 2) + p / 16;
  // 3 bits: byte p = 16 lane + 8 half + 2 m + w is word 2 m + w of 128-bit lane `lane` of
  // word vector `half`, code 16 half + 4 lane + m + 8 w of the 32.
  const int lane = p / 16, half = (p % 16) / 8, m = (p % 8) / 2, w = p % 2;
  return 32 * v + 16 * half + 4 * lane + m + 8 * w;
}

struct Int8Codebook {
  __m256i table;         // c8 (values) or c8 + kKeyOffset (keys) in both 128-bit lanes
  float scale = 1.0f;    // c_scale
};

inline Int8Codebook make_int8_codebook(const float* centroids, int bits, bool offset) {
  const int n = 1 << bits;
  float top = 0.0f;
  for (int i = 0; i < n; ++i) top = std::max(top, std::fabs(centroids[i]));
  Int8Codebook book;
  book.scale = top > 0.0f ? top / kCentroidMax : 1.0f;
  alignas(16) uint8_t c8[16] = {};
  for (int i = 0; i < n; ++i) {
    const int c = static_cast<int>(std::lrint(centroids[i] / book.scale));
    c8[i] = static_cast<uint8_t>(offset ? c + kKeyOffset : c);
  }
  book.table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(c8)));
  return book;
}

// The sum of 2 x 2 adjacent products u8 * s8 per 32-bit lane, two vpmaddubsw added in 16 bits
// (within range by the bounds above) and one vpmaddwd (the AVX2 path).
__attribute__((always_inline)) inline __m256i dot2x2(__m256i u0, __m256i s0, __m256i u1,
                                                     __m256i s1) {
  const __m256i pairs =
      _mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// The looked-up codes of one token: d / 32 vectors of 32 bytes at out, storage order.
template <int B>
__attribute__((always_inline)) inline void expand_token(const uint8_t* codes, int d,
                                                        __m256i table, __m256i* out) {
  if constexpr (B == 4) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int h = 0; h < d / 64; ++h) {
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * h));
      out[2 * h] = _mm256_shuffle_epi8(table, _mm256_and_si256(c, low4));
      out[2 * h + 1] =
          _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(c, 4), low4));
    }
  } else if constexpr (B == 3) {
    // 32 codes (12 bytes) per vector: two vectors of 16-bit words, one code per word. A
    // dword holds codes j and j + 8 (24 bits apart, so at the same bit offset in their bytes):
    // vpshufb puts the two bytes that hold each code in its word, one vpsrlvd per dword
    // aligns both, a mask keeps 3 bits, and vpackuswb joins the two vectors (byte order in
    // storage_coordinate). No multiply: the multiply ports are the AVX2 kernel's bound.
    const __m256i gather0 = _mm256_setr_epi8(0, 1, 3, 4, 0, 1, 3, 4, 0, 1, 3, 4, 1, 2, 4, 5,  //
                                             1, 2, 4, 5, 1, 2, 4, 5, 2, 3, 5, 6, 2, 3, 5, 6);
    const __m256i gather1 = _mm256_add_epi8(gather0, _mm256_set1_epi8(6));  // codes 16..31
    const __m256i shifts = _mm256_setr_epi32(0, 3, 6, 1, 4, 7, 2, 5);
    const __m256i low3 = _mm256_set1_epi16(0x07);
    for (int v = 0; v < d / 32; ++v) {
      const __m256i bytes = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 12 * v)));
      const __m256i w0 = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, gather0), shifts), low3);
      const __m256i w1 = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, gather1), shifts), low3);
      out[v] = _mm256_shuffle_epi8(table, _mm256_packus_epi16(w0, w1));
    }
  } else {
    static_assert(B == 2, "2, 3 or 4 bits");
    // 16 bytes hold 64 codes, code 4 i + f in bits 2 f of byte i: broadcast to both lanes,
    // the high lane shifted 2 bits further, they give fields (0 | 1) and (2 | 3).
    const __m256i lane_shift = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
    const __m256i low2 = _mm256_set1_epi8(0x03);
    for (int u = 0; u < d / 64; ++u) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * u));
      const __m256i x = _mm256_srlv_epi32(_mm256_broadcastsi128_si256(bytes), lane_shift);
      out[2 * u] = _mm256_shuffle_epi8(table, _mm256_and_si256(x, low2));
      out[2 * u + 1] =
          _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi32(x, 4), low2));
    }
  }
}

// Line t of the `ahead` bytes at `next` (a tensor's next block), if there is one: issued with
// token t of the current block, one line per token instead of a burst per block, which stalls
// on the outstanding misses.
inline void prefetch_line(const uint8_t* next, size_t ahead, int t) {
  if (size_t(64) * t < ahead) __builtin_prefetch(next + size_t(64) * t, 0, 3);
}

// Every token of the block expanded: looked[t * d ...], zero past n; prefetch_line(t) with
// token t.
template <int B>
inline void expand_block_bits(const Int8Codebook& book, const uint8_t* codes, size_t stride,
                              int d, int n, uint8_t* looked, const uint8_t* next, size_t ahead) {
  for (int t = 0; t < kDecodeBlock; ++t) {
    prefetch_line(next, ahead, t);
    __m256i* out = reinterpret_cast<__m256i*>(looked + t * d);
    if (t < n) {
      expand_token<B>(codes + t * stride, d, book.table, out);
    } else {
      for (int v = 0; v < d / 32; ++v) out[v] = _mm256_setzero_si256();
    }
  }
}

// The same for a tensor of `bits` (2, 3 or 4).
inline void expand_block(const Int8Codebook& book, int bits, const uint8_t* codes, size_t stride,
                         int d, int n, uint8_t* looked, const uint8_t* next, size_t ahead) {
  if (bits == 4) {
    expand_block_bits<4>(book, codes, stride, d, n, looked, next, ahead);
  } else if (bits == 3) {
    expand_block_bits<3>(book, codes, stride, d, n, looked, next, ahead);
  } else {
    expand_block_bits<2>(book, codes, stride, d, n, looked, next, ahead);
  }
}

// The query rows of an item rounded to 7 bits in the key codes' storage order.
struct Int8Queries {
  alignas(32) int8_t q[kInt8MaxRows][kInt8MaxDim];
  float scale[kInt8MaxRows];  // q_scale * c_scale
  int32_t offset[kInt8MaxRows];  // kKeyOffset * sum_j q7[j]
};

// order[bits - 2][i] = coordinate(bits, i) for bits 2..4, i < kInt8MaxDim: a permutation of
// the coordinates that is the same for every d that is a multiple of 64.
struct CoordinateOrder {
  uint8_t order[3][kInt8MaxDim];
  explicit CoordinateOrder(int (*coordinate)(int bits, int i)) {
    for (int b = 0; b < 3; ++b) {
      for (int i = 0; i < kInt8MaxDim; ++i) {
        order[b][i] = static_cast<uint8_t>(coordinate(b + 2, i));
      }
    }
  }
};
// Which coordinate goes to storage position i.
inline const CoordinateOrder kStorageOrder(
    [](int bits, int i) { return storage_coordinate(bits, i / 32, i % 32); });

inline void make_int8_queries(const float* q, int rows, int d, int bits, float c_scale,
                              Int8Queries& out) {
  const uint8_t* order = kStorageOrder.order[bits - 2];
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int r = 0; r < rows; ++r) {
    const float* row = q + static_cast<int64_t>(r) * d;
    __m256 top = _mm256_setzero_ps();
    for (int j = 0; j < d; j += 8) {
      top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(row + j), abs_mask));
    }
    const float max_q = max_lanes(top);
    const float scale = max_q > 0.0f ? max_q / kQ7 : 1.0f;
    const __m256 inv = _mm256_set1_ps(1.0f / scale);
    alignas(32) int32_t q7[kInt8MaxDim];
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < d; j += 8) {
      const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
      sum = _mm256_add_epi32(sum, v);
      _mm256_store_si256(reinterpret_cast<__m256i*>(q7 + j), v);
    }
    for (int i = 0; i < d; ++i) out.q[r][i] = static_cast<int8_t>(q7[order[i]]);
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    out.scale[r] = scale * c_scale;
    out.offset[r] = kKeyOffset * _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
  }
}

// scores[r * kDecodeBlock + t] = <q_{r0 + r}, centroids of key t> for r < rows, from the
// block's expanded keys (8-bit products). R <= 4 rows per pass over the keys.
template <int R, int D>
inline void score_rows_int8(const uint8_t* looked, const Int8Queries& q, int r0, int d_runtime,
                            float* scores) {
  const int d = D > 0 ? D : d_runtime;
  alignas(16) int32_t sums[kDecodeBlock][4];
  for (int t = 0; t < kDecodeBlock; ++t) {
    const __m256i* c = reinterpret_cast<const __m256i*>(looked + t * d);
    __m256i a[4];
    for (int r = 0; r < 4; ++r) a[r] = _mm256_setzero_si256();
#if defined(__AVX512VNNI__)
    for (int v = 0; v < d / 32; ++v) {
      const __m256i cv = _mm256_load_si256(c + v);
      for (int r = 0; r < R; ++r) {
        const __m256i qv =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(&q.q[r0 + r][32 * v]));
        a[r] = _mm256_dpbusd_epi32(a[r], cv, qv);
      }
    }
#else
    for (int v = 0; v < d / 32; v += 2) {
      const __m256i c0 = _mm256_load_si256(c + v), c1 = _mm256_load_si256(c + v + 1);
      for (int r = 0; r < R; ++r) {
        const __m256i* qr = reinterpret_cast<const __m256i*>(&q.q[r0 + r][32 * v]);
        a[r] = _mm256_add_epi32(
            a[r], dot2x2(c0, _mm256_load_si256(qr), c1, _mm256_load_si256(qr + 1)));
      }
    }
#endif
    const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
    _mm_store_si128(reinterpret_cast<__m128i*>(sums[t]),
                    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1)));
  }
  // [t][r] -> scores[r][t], 4 tokens at a time: (sum - offset) * scale, transposed.
  alignas(16) int32_t offset[4] = {};
  alignas(16) float scale[4] = {};
  for (int r = 0; r < R; ++r) {
    offset[r] = q.offset[r0 + r];
    scale[r] = q.scale[r0 + r];
  }
  const __m128i vo = _mm_load_si128(reinterpret_cast<const __m128i*>(offset));
  const __m128 vs = _mm_load_ps(scale);
  for (int t = 0; t < kDecodeBlock; t += 4) {
    __m128 x[4];
    for (int u = 0; u < 4; ++u) {
      const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(sums[t + u]));
      x[u] = _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(v, vo)), vs);
    }
    _MM_TRANSPOSE4_PS(x[0], x[1], x[2], x[3]);
    for (int r = 0; r < R; ++r) _mm_storeu_ps(scores + r * kDecodeBlock + t, x[r]);
  }
}

template <int D>
inline void score_block_int8(const uint8_t* looked, const Int8Queries& q, int r0, int rows,
                             int d, float* scores) {
  for (int r = 0; r < rows; r += 4) {
    float* out = scores + r * kDecodeBlock;
    switch (std::min(4, rows - r)) {
      case 1:
        score_rows_int8<1, D>(looked, q, r0 + r, d, out);
        break;
      case 2:
        score_rows_int8<2, D>(looked, q, r0 + r, d, out);
        break;
      case 3:
        score_rows_int8<3, D>(looked, q, r0 + r, d, out);
        break;
      default:
        score_rows_int8<4, D>(looked, q, r0 + r, d, out);
    }
  }
}

// Dword lane L of interleaved vector g = 4 v + k of a quad holds, for 4 tokens, byte
// p = value_byte(k, L) of their expanded vector v (the order of the unpacks below).
constexpr int value_byte(int k, int lane) { return lane < 4 ? 4 * k + lane : 16 + 4 * k + lane - 4; }
inline int value_coordinate(int bits, int g, int lane) {
  return storage_coordinate(bits, g / 4, value_byte(g % 4, lane));
}

// Vectors x0..x3 of 4 tokens interleaved byte by byte: dword lane L of out[k] holds byte
// value_byte(k, L) of each.
__attribute__((always_inline)) inline void interleave_quad(__m256i x0, __m256i x1, __m256i x2,
                                                           __m256i x3, __m256i* out) {
  const __m256i lo01 = _mm256_unpacklo_epi8(x0, x1), hi01 = _mm256_unpackhi_epi8(x0, x1);
  const __m256i lo23 = _mm256_unpacklo_epi8(x2, x3), hi23 = _mm256_unpackhi_epi8(x2, x3);
  out[0] = _mm256_unpacklo_epi16(lo01, lo23);
  out[1] = _mm256_unpackhi_epi16(lo01, lo23);
  out[2] = _mm256_unpacklo_epi16(hi01, hi23);
  out[3] = _mm256_unpackhi_epi16(hi01, hi23);
}

// The expanded values of the block (looked, [kDecodeBlock][d]) with 4 tokens interleaved byte
// by byte: out[quad * (d / 8) + g], g = 4 v + k.
inline void interleave_values(const uint8_t* looked, int d, __m256i* out) {
  const int vectors = d / 32;
  for (int quad = 0; quad < kDecodeBlock / 4; ++quad) {
    const __m256i* x = reinterpret_cast<const __m256i*>(looked + 4 * quad * d);
    __m256i* o = out + quad * (d / 8);
    for (int v = 0; v < vectors; ++v) {
      const __m256i x0 = _mm256_load_si256(x + v), x1 = _mm256_load_si256(x + vectors + v);
      const __m256i x2 = _mm256_load_si256(x + 2 * vectors + v);
      const __m256i x3 = _mm256_load_si256(x + 3 * vectors + v);
      interleave_quad(x0, x1, x2, x3, o + 4 * v);
    }
  }
}

// The same for 4-bit values straight from the codes: the code bytes of 4 tokens are
// interleaved first (half the bytes of the expanded ones), then split into nibbles and looked
// up; the lookup works byte by byte, so the result equals interleave_values of the expanded
// block. Tokens past n read as code 0 (their weights are 0). prefetch_line(t) with token t.
inline void interleave_values_4bit(const Int8Codebook& book, const uint8_t* codes, size_t stride,
                                   int d, int n, const uint8_t* next, size_t ahead,
                                   __m256i* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int quad = 0; quad < kDecodeBlock / 4; ++quad) {
    for (int i = 0; i < 4; ++i) prefetch_line(next, ahead, 4 * quad + i);
    __m256i* o = out + quad * (d / 8);
    for (int h = 0; h < d / 64; ++h) {
      __m256i x[4];
      for (int i = 0; i < 4; ++i) {
        const int t = 4 * quad + i;
        x[i] = t < n ? _mm256_loadu_si256(
                           reinterpret_cast<const __m256i*>(codes + t * stride + 32 * h))
                     : _mm256_setzero_si256();
      }
      __m256i r[4];
      interleave_quad(x[0], x[1], x[2], x[3], r);
      for (int k = 0; k < 4; ++k) {
        o[8 * h + k] = _mm256_shuffle_epi8(book.table, _mm256_and_si256(r[k], low4));
        o[8 * h + 4 + k] =
            _mm256_shuffle_epi8(book.table, _mm256_and_si256(_mm256_srli_epi16(r[k], 4), low4));
      }
    }
  }
}

// acc[r] (interleaved order) += sum_t w[r][t] * centroids of value t, for r < R, with the
// block's interleaved c8: the weights of each row rounded to 8 bits of its max.
template <int R>
inline void accumulate_block_int8(const Int8Codebook& book, const __m256i* interleaved,
                                  const float* w, int d, float* acc) {
  alignas(32) uint8_t w8[R][kDecodeBlock];
  float scale[R];
  for (int r = 0; r < R; ++r) {
    const float* wr = w + r * kDecodeBlock;
    __m256 top = _mm256_loadu_ps(wr);
    for (int i = 8; i < kDecodeBlock; i += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(wr + i));
    const float max_w = max_lanes(top);
    scale[r] = max_w / 127.0f * book.scale;
    const __m256 inv = _mm256_set1_ps(max_w > 0.0f ? 127.0f / max_w : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(wr + 8 * i), inv));
    }
    // packs works per 128-bit lane: reorder the 64-bit quarters after each step.
    const __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
    const __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(p01, p23), 0xD8);
    _mm256_store_si256(reinterpret_cast<__m256i*>(w8[r]), bytes);
  }
  constexpr int CG = R <= 2 ? 4 : (R <= 4 ? 2 : 1);  // interleaved vectors per pass
  const int vectors = d / 8;
  for (int g = 0; g < vectors; g += CG) {
    __m256i a[R][CG];
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < CG; ++c) a[r][c] = _mm256_setzero_si256();
    }
#if defined(__AVX512VNNI__)
    for (int k = 0; k < kDecodeBlock / 4; ++k) {
      __m256i x[CG];
      for (int c = 0; c < CG; ++c) x[c] = _mm256_load_si256(interleaved + k * vectors + g + c);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, &w8[r][4 * k], sizeof(four));
        const __m256i wv = _mm256_set1_epi32(four);
        for (int c = 0; c < CG; ++c) {
          a[r][c] = _mm256_dpbusd_epi32(a[r][c], wv, x[c]);
        }
      }
    }
#else
    for (int k = 0; k < kDecodeBlock / 4; k += 2) {
      for (int r = 0; r < R; ++r) {
        int32_t four0, four1;
        std::memcpy(&four0, &w8[r][4 * k], sizeof(four0));
        std::memcpy(&four1, &w8[r][4 * k + 4], sizeof(four1));
        const __m256i w0 = _mm256_set1_epi32(four0), w1 = _mm256_set1_epi32(four1);
        for (int c = 0; c < CG; ++c) {
          const __m256i x0 = _mm256_load_si256(interleaved + k * vectors + g + c);
          const __m256i x1 = _mm256_load_si256(interleaved + (k + 1) * vectors + g + c);
          a[r][c] = _mm256_add_epi32(a[r][c], dot2x2(w0, x0, w1, x1));
        }
      }
    }
#endif
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_set1_ps(scale[r]);
      float* out = acc + static_cast<int64_t>(r) * d + 8 * g;
      for (int c = 0; c < CG; ++c) {
        _mm256_storeu_ps(out + 8 * c, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r][c]), s,
                                                      _mm256_loadu_ps(out + 8 * c)));
      }
    }
  }
}

// The coordinate of position i of the interleaved value sums.
inline const CoordinateOrder kValueOrder(
    [](int bits, int i) { return value_coordinate(bits, i / 8, i % 8); });

// Row acc (d floats) from the interleaved order back to coordinate order.
inline void values_to_coordinate_order(float* acc, int d, int bits) {
  const uint8_t* order = kValueOrder.order[bits - 2];
  alignas(32) float natural[kInt8MaxDim];
  for (int i = 0; i < d; ++i) natural[order[i]] = acc[i];
  std::memcpy(acc, natural, sizeof(float) * d);
}

// The item: rows of the single query of problem p on KV head h (q: [group, d] in the key
// frame), keys [k_begin, k_end); state gets {m, l, acc} of every row (acc in the value frame).
// D = head_dim, or 0 for a runtime head_dim.
template <class Lookup, int D>
void decode_item(const TurboQuantKVView& kv, const VectorDecoder& key_decoder,
                 const VectorDecoder& value_decoder, const AttendProblem& p, int h, const float* q,
                 int64_t k_begin, int64_t k_end, SoftmaxStates& state) {
  const int d = D > 0 ? D : p.head_dim;
  const int group = p.n_heads / p.kv_heads;
  state.reset(group, d);
  const int64_t head_row = h * kv.head_stride;
  const DecodeTensor keys = make_decode_tensor(kv.keys, key_decoder, head_row);
  const DecodeTensor values = make_decode_tensor(kv.values, value_decoder, head_row);
  alignas(32) float scores[kMaxDecodeRows * kDecodeBlock];  // [rows, block]
  alignas(32) float weights[kMaxDecodeRows * kDecodeBlock];
  alignas(32) float key_scale[kDecodeBlock];  // attention scale * key norm
  alignas(32) float value_scale[kDecodeBlock];
  const bool int8 = code_products() == CodeProducts::kInt8;
  const bool keys_int8 = int8 && int8_eligible(keys.bits, d, group);
  const bool values_int8 = int8 && int8_eligible(values.bits, d, group);
  Int8Codebook key_book, value_book;
  Int8Queries q8;
  alignas(32) uint8_t looked[kDecodeBlock * kInt8MaxDim];  // expanded keys, then values
  __m256i interleaved[kDecodeBlock / 4 * kInt8MaxDim / 8];
  if (keys_int8) {
    key_book = make_int8_codebook(key_decoder.segments[0].centroids, keys.bits, true);
    make_int8_queries(q, group, d, keys.bits, key_book.scale, q8);
  }
  if (values_int8) {
    value_book = make_int8_codebook(value_decoder.segments[0].centroids, values.bits, false);
  }
  for (int64_t t0 = k_begin; t0 < k_end; t0 += kDecodeBlock) {
    const int n = static_cast<int>(std::min<int64_t>(kDecodeBlock, k_end - t0));
    // The next block's key and value codes, one block ahead: 5-12% at 16k-64k tokens with the
    // 8-bit products, up to 3% with the exact ones (bench attention, AVX2); further ahead
    // measured slower. A tensor with the 8-bit products prefetches inside its expansion, a
    // line per token (about 3% more at 16k on AVX2 than the burst before the block).
    const int64_t next = t0 + kDecodeBlock;
    const int ahead = static_cast<int>(std::clamp<int64_t>(k_end - next, 0, kDecodeBlock));
    const uint8_t* key_codes = keys.codes + t0 * keys.code_bytes;
    const uint8_t* value_codes = values.codes + t0 * values.code_bytes;
    const uint8_t* next_keys = ahead > 0 ? key_codes + kDecodeBlock * keys.code_bytes : nullptr;
    const uint8_t* next_values =
        ahead > 0 ? value_codes + kDecodeBlock * values.code_bytes : nullptr;
    if (!keys_int8) prefetch_bytes(next_keys, ahead * keys.code_bytes);
    if (!values_int8) prefetch_bytes(next_values, ahead * values.code_bytes);
    decode_norms(keys.norms + t0, n, p.scale, key_scale);
    decode_norms(values.norms + t0, n, 1.0f, value_scale);
    if (values_int8 && values.bits == 4) {
      interleave_values_4bit(value_book, value_codes, values.code_bytes, d, n, next_values,
                             ahead * values.code_bytes, interleaved);
    } else if (values_int8) {
      expand_block(value_book, values.bits, value_codes, values.code_bytes, d, n, looked,
                   next_values, ahead * values.code_bytes);
      interleave_values(looked, d, interleaved);
    }
    if (keys_int8) {
      expand_block(key_book, keys.bits, key_codes, keys.code_bytes, d, n, looked, next_keys,
                   ahead * keys.code_bytes);
    }
    for (int r0 = 0; r0 < group; r0 += kMaxDecodeRows) {
      const int rows = std::min(kMaxDecodeRows, group - r0);
      const float* q_rows = q + static_cast<int64_t>(r0) * d;
      if (keys_int8) {
        score_block_int8<D>(looked, q8, r0, rows, d, scores);
      } else {
        dispatch_decode(keys.bits, rows, [&]<int B, int R>() {
          score_block<Lookup, B, R, D>(keys.table, key_codes, keys.code_bytes, q_rows, d, n,
                                       scores);
        });
      }
      dispatch_rows(rows, [&]<int R>() {
        softmax_block_rows<R>(scores, key_scale, value_scale, n, p.logit_softcap, state, r0,
                              weights);
      });
      float* acc = &state.acc[static_cast<size_t>(r0) * d];
      dispatch_decode(values.bits, rows, [&]<int B, int R>() {
        if (values_int8) {
          accumulate_block_int8<R>(value_book, interleaved, weights, d, acc);
        } else {
          accumulate_block<Lookup, B, R, D>(values.table, value_codes, values.code_bytes, weights,
                                            d, n, acc);
        }
      });
    }
  }
  if (values_int8) {
    for (int r = 0; r < group; ++r) {
      values_to_coordinate_order(&state.acc[size_t(r) * d], d, values.bits);
    }
  }
}

// FastDecode of attention_turboquant_on (attention_codes_core.h) for one Lookup.
template <class Lookup>
struct CodeDecodeKernel {
  static bool eligible(const VectorDecoder& keys, const VectorDecoder& values) {
    return keys.fusable && values.fusable;
  }
  template <int D>
  static void run(const TurboQuantKVView& kv, const VectorDecoder& key_decoder,
                  const VectorDecoder& value_decoder, const AttendProblem& p, int h, const float* q,
                  int64_t k_begin, int64_t k_end, SoftmaxStates& state) {
    decode_item<Lookup, D>(kv, key_decoder, value_decoder, p, h, q, k_begin, k_end, state);
  }
};

}  // namespace
}  // namespace turbokv::attention_detail
