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
// No quantized lookup tables: products and sums are fp32 on the exact codebook values, so the
// result equals the reference on the dequantized cache up to float rounding (the tile path's
// tolerance). Other codecs (split k + 0.5 bits, more than 4 bits, head_dim % 8 != 0) take the
// tile path of attention_core.h.
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

// Calls fn.template operator()<B, R>() for bits in 1..4 and rows in 1..kMaxDecodeRows.
template <class Fn>
void dispatch_decode(int bits, int rows, Fn&& fn) {
  auto with_rows = [&]<int B>() {
    switch (rows) {
      case 1:
        return fn.template operator()<B, 1>();
      case 2:
        return fn.template operator()<B, 2>();
      case 3:
        return fn.template operator()<B, 3>();
      case 4:
        return fn.template operator()<B, 4>();
      case 5:
        return fn.template operator()<B, 5>();
      case 6:
        return fn.template operator()<B, 6>();
      case 7:
        return fn.template operator()<B, 7>();
      default:
        return fn.template operator()<B, 8>();
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

// Row r of the block: s = scores * key_scale (soft-capped; -inf past n), folded into the
// online softmax of state row `row`; w = exp(s - m) * value_scale. scores, w: kDecodeBlock
// floats; acc of the row rescaled when its max grows.
inline void softmax_block_row(float* scores, const float* key_scale, const float* value_scale,
                              int n, float softcap, SoftmaxStates& state, int row, float* w) {
  constexpr int kVectors = kDecodeBlock / 8;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  __m256 s[kVectors];
  for (int i = 0; i < kVectors; ++i) {
    s[i] = _mm256_mul_ps(_mm256_loadu_ps(scores + 8 * i), _mm256_loadu_ps(key_scale + 8 * i));
  }
  if (softcap > 0) {
    alignas(32) float x[kDecodeBlock];
    for (int i = 0; i < kVectors; ++i) _mm256_store_ps(x + 8 * i, s[i]);
    for (int t = 0; t < n; ++t) x[t] = softcap * std::tanh(x[t] / softcap);
    for (int i = 0; i < kVectors; ++i) s[i] = _mm256_load_ps(x + 8 * i);
  }
  if (n < kDecodeBlock) {  // the last block: keys past n do not exist
    const __m256 lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    for (int i = 0; i < kVectors; ++i) {
      const __m256 past = _mm256_cmp_ps(_mm256_add_ps(lanes, _mm256_set1_ps(float(8 * i))),
                                        _mm256_set1_ps(float(n)), _CMP_GE_OQ);
      s[i] = _mm256_blendv_ps(s[i], _mm256_set1_ps(neg_inf), past);
    }
  }
  __m256 block_max = s[0];
  for (int i = 1; i < kVectors; ++i) block_max = _mm256_max_ps(block_max, s[i]);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(block_max), _mm256_extractf128_ps(block_max, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  const float new_max = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  float& m = state.m[row];
  float& l = state.l[row];
  if (new_max > m) {
    if (m != neg_inf) {  // rescale what the row holds (nothing before its first key)
      const float alpha = std::exp(m - new_max);
      l *= alpha;
      float* acc = &state.acc[static_cast<size_t>(row) * state.d];
      const __m256 va = _mm256_set1_ps(alpha);
      for (int c = 0; c < state.d; c += 8) {
        _mm256_storeu_ps(acc + c, _mm256_mul_ps(_mm256_loadu_ps(acc + c), va));
      }
    }
    m = new_max;
  }
  const __m256 shift = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (int i = 0; i < kVectors; ++i) {
    const __m256 p = avx2::exp8_flush_underflow(_mm256_sub_ps(s[i], shift));
    sum = _mm256_add_ps(sum, p);
    _mm256_storeu_ps(w + 8 * i, _mm256_mul_ps(p, _mm256_loadu_ps(value_scale + 8 * i)));
  }
  l += Avx2Isa::hsum(sum);
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
  // No software prefetch: the four streams (key and value codes and norms) are sequential, and
  // the hardware prefetchers keep up better than prefetch instructions do (measured).
  for (int64_t t0 = k_begin; t0 < k_end; t0 += kDecodeBlock) {
    const int n = static_cast<int>(std::min<int64_t>(kDecodeBlock, k_end - t0));
    const uint8_t* key_codes = keys.codes + t0 * keys.code_bytes;
    const uint8_t* value_codes = values.codes + t0 * values.code_bytes;
    decode_norms(keys.norms + t0, n, p.scale, key_scale);
    decode_norms(values.norms + t0, n, 1.0f, value_scale);
    for (int r0 = 0; r0 < group; r0 += kMaxDecodeRows) {
      const int rows = std::min(kMaxDecodeRows, group - r0);
      const float* q_rows = q + static_cast<int64_t>(r0) * d;
      dispatch_decode(keys.bits, rows, [&]<int B, int R>() {
        score_block<Lookup, B, R, D>(keys.table, key_codes, keys.code_bytes, q_rows, d, n, scores);
      });
      for (int r = 0; r < rows; ++r) {
        softmax_block_row(scores + r * kDecodeBlock, key_scale, value_scale, n, p.logit_softcap,
                          state, r0 + r, weights + r * kDecodeBlock);
      }
      float* acc = &state.acc[static_cast<size_t>(r0) * d];
      dispatch_decode(values.bits, rows, [&]<int B, int R>() {
        accumulate_block<Lookup, B, R, D>(values.table, value_codes, values.code_bytes, weights, d,
                                          n, acc);
      });
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
