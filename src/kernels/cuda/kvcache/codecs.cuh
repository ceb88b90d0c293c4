// How the attention kernel (attention_kernel.cuh) reads each block format: one policy class per
// format with the same members, all device code.
//
//   kE                      value dims a lane accumulates (acc registers per row)
//   Tables                  shared-memory tables (centroids), filled by load_tables
//   value_dim(lane, e)      frame coordinate of the lane's e-th value dim (>= head_dim: none)
//   load_query(q, r, h, b, ..)  the block's row r (nullptr: padding) of KV head h and
//                           sequence b into the codec frame, as component r of QueryShared::q
//                           (+ qm / qsum where the codec uses them)
//   score(k, kaux, ..., s)  s[r] = <query row r, key> of one staged key row (lane = token)
//   value_scale(vaux)       factor folded into the token's probability (TurboQuant 1-segment
//                           value norm), else 1
//   accumulate(v, vaux, p, ..., acc)  acc[r][e] += p.r * value[value_dim(lane, e)] (one token)
//
// Staged rows are byte-identical to the block's (plan.h StageRegion), so a key row is the CPU
// codec's record; rows are at least 4-B aligned where their size is a multiple of 4.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/kvcache/frame.cuh"
#include "kernels/cuda/kvcache/plan.h"

namespace turbokv::cuda::paged {

static_assert(kRows == 4, "query rows travel as float4");

struct QueryShared {
  float4 q[kMaxHeadDim];             // [dim]: the block's rows in the codec frame (x = row 0)
  float qm[kRows];                   // <q, float(key mean)> (TurboQuant centering), else 0
  float qsum[kRows][8];              // uniform: Σ of row r over each group
  float4 p[kMaxWarps][kTileTokens];  // per warp: the tile's probabilities * value_scale
};

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// Code i of a packed row at bit `bit` (bits 1..8; reads at most the two bytes holding it).
__device__ __forceinline__ uint32_t code_at(const uint8_t* row, int bit, int bits) {
  uint32_t v = row[bit >> 3];
  if ((bit & 7) + bits > 8) v |= uint32_t(row[(bit >> 3) + 1]) << 8;
  return (v >> (bit & 7)) & ((1u << bits) - 1);
}

// Sequential reader of a packed row's codes (LSB-first), one byte at a time.
struct CodeReader {
  const uint8_t* p;
  uint32_t buffer = 0;
  int have = 0;
  __device__ __forceinline__ explicit CodeReader(const uint8_t* row) : p(row) {}
  __device__ __forceinline__ uint32_t next(int bits) {
    if (have < bits) {
      buffer |= uint32_t(*p++) << have;
      have += 8;
    }
    const uint32_t code = buffer & ((1u << bits) - 1);
    buffer >>= bits;
    have -= bits;
    return code;
  }
};

__device__ __forceinline__ void fma4(float4& acc, const float4& q, float x) {
  acc.x += q.x * x;
  acc.y += q.y * x;
  acc.z += q.z * x;
  acc.w += q.w * x;
}

__device__ __forceinline__ void add_scaled(float (&s)[kRows], const float4& d, float scale) {
  s[0] += d.x * scale;
  s[1] += d.y * scale;
  s[2] += d.z * scale;
  s[3] += d.w * scale;
}

template <int kE>
__device__ __forceinline__ void accumulate_value(float (&acc)[kRows][kE], int e, const float4& p,
                                                 float v) {
  acc[0][e] += p.x * v;
  acc[1][e] += p.y * v;
  acc[2][e] += p.z * v;
  acc[3][e] += p.w * v;
}

// Row r of the query as it is (dense and uniform caches have no rotation). Warp-collective.
__device__ __forceinline__ void copy_query_row(const float* q, int head_dim, int r, QueryShared& qs,
                                               int lane) {
  float* frame = reinterpret_cast<float*>(qs.q);
  for (int d = lane; d < head_dim; d += 32) frame[d * 4 + r] = q != nullptr ? q[d] : 0.0f;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// ---------------------------------------------------------------------------------------------
// Dense f32 / f16 / bf16.

template <typename T>
__device__ __forceinline__ float load_elem(const uint8_t* row, int i) {
  if constexpr (sizeof(T) == 4) {
    return reinterpret_cast<const float*>(row)[i];
  } else {
    return float(reinterpret_cast<const T*>(row)[i]);
  }
}

template <typename T>
struct DenseCodec {
  static constexpr int kE = kMaxHeadDim / 32;
  struct Tables {};
  int head_dim;

  __device__ void load_tables(Tables&, int, int) const {}
  __device__ int value_dim(int lane, int e) const { return lane + 32 * e; }
  __device__ void load_query(const float* q, int r, int, int, QueryShared& qs, float*,
                             int lane) const {
    copy_query_row(q, head_dim, r, qs, lane);
    if (lane == 0) qs.qm[r] = 0;
  }
  __device__ void score(const uint8_t* k, const uint8_t*, const QueryShared& qs, const Tables&,
                        float (&s)[kRows]) const {
    float4 d = make_float4(0, 0, 0, 0);
#pragma unroll 4
    for (int i = 0; i < head_dim; ++i) fma4(d, qs.q[i], load_elem<T>(k, i));
    add_scaled(s, d, 1.0f);
  }
  __device__ float value_scale(const uint8_t*) const {
    return 1.0f;
  }
  __device__ void accumulate(const uint8_t* v, const uint8_t*, const float4& p, const Tables&,
                             int lane, float (&acc)[kRows][kE]) const {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int d = lane + 32 * e;
      if (d < head_dim) accumulate_value(acc, e, p, load_elem<T>(v, d));
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Uniform affine groups: value = scale * code + min per group.

struct UniformCodec {
  static constexpr int kE = kMaxHeadDim / 32;
  struct Tables {};
  UniformFormat f;

  __device__ void load_tables(Tables&, int, int) const {}
  __device__ int value_dim(int lane, int e) const { return lane + 32 * e; }
  __device__ void load_query(const float* q, int r, int kv_head, int, QueryShared& qs,
                             float* scratch, int lane) const {
    if (f.rotated) {  // the keys' frame: R_k q (scores are unchanged by the rotation)
      float* frame = reinterpret_cast<float*>(qs.q);
      rotate_query_row(f.key_rotation, nullptr, q, kv_head, f.head_dim, r, frame, scratch, lane);
      for (int g = 0; g < f.key.groups; ++g) {
        const int begin = g * f.key.group_size, end = min(f.head_dim, begin + f.key.group_size);
        float sum = 0;
        for (int i = begin + lane; i < end; i += 32) sum += frame[i * 4 + r];
        sum = warp_sum(sum);
        if (lane == 0) qs.qsum[r][g] = sum;
      }
      if (lane == 0) qs.qm[r] = 0;
      return;
    }
    copy_query_row(q, f.head_dim, r, qs, lane);
    for (int g = 0; g < f.key.groups; ++g) {
      const int begin = g * f.key.group_size, end = min(f.head_dim, begin + f.key.group_size);
      float sum = 0;
      for (int i = begin + lane; i < end; i += 32) sum += q != nullptr ? q[i] : 0.0f;
      sum = warp_sum(sum);
      if (lane == 0) qs.qsum[r][g] = sum;
    }
    if (lane == 0) qs.qm[r] = 0;
  }
  // Σ_g scale_g <q_g, codes_g> + min_g Σ q_g
  __device__ void score(const uint8_t* k, const uint8_t* kaux, const QueryShared& qs, const Tables&,
                        float (&s)[kRows]) const {
    CodeReader reader(k);
    for (int g = 0; g < f.key.groups; ++g) {
      const int begin = g * f.key.group_size, end = min(f.head_dim, begin + f.key.group_size);
      float4 d = make_float4(0, 0, 0, 0);
      for (int i = begin; i < end; ++i) fma4(d, qs.q[i], float(reader.next(f.key.bits)));
      const float scale = half_at(kaux + 4 * g), mn = half_at(kaux + 4 * g + 2);
      s[0] += scale * d.x + mn * qs.qsum[0][g];
      s[1] += scale * d.y + mn * qs.qsum[1][g];
      s[2] += scale * d.z + mn * qs.qsum[2][g];
      s[3] += scale * d.w + mn * qs.qsum[3][g];
    }
  }
  __device__ float value_scale(const uint8_t*) const { return 1.0f; }
  __device__ void accumulate(const uint8_t* v, const uint8_t* vaux, const float4& p, const Tables&,
                             int lane, float (&acc)[kRows][kE]) const {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int d = lane + 32 * e;
      if (d < f.head_dim) {
        const int g = d / f.value.group_size;
        const float x = half_at(vaux + 4 * g) * float(code_at(v, d * f.value.bits, f.value.bits)) +
                        half_at(vaux + 4 * g + 2);
        accumulate_value(acc, e, p, x);
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// TurboQuant, shared by the runtime-generic and the compile-time codecs: the query rotation and
// the key centering term.

__device__ __forceinline__ void load_tq_query(const TQFormat& f, const TQSequenceState* states,
                                              const float* q, int r, int kv_head, int b,
                                              QueryShared& qs, float* scratch, int lane) {
  const TQSequenceState state = states != nullptr ? states[b] : TQSequenceState{};
  rotate_query_row(f.key, state.key_order, q, kv_head, f.head_dim, r,
                   reinterpret_cast<float*>(qs.q), scratch, lane);
  float qm = 0;
  if (state.key_mean != nullptr && q != nullptr) {
    for (int c = lane; c < f.head_dim; c += 32) {
      qm += q[c] * __half2float(state.key_mean[kv_head * f.head_dim + c]);
    }
    qm = warp_sum(qm);
  }
  if (lane == 0) qs.qm[r] = qm;
}

// Runtime-generic TurboQuant: 1 or 2 segments, any head_dim and bits.
struct TQGenericCodec {
  static constexpr int kE = kMaxHeadDim / 32;
  struct Tables {
    float c[4][256];  // centroids: key segment 0, 1, value segment 0, 1
  };
  TQFormat f;
  const TQSequenceState* states;  // [batch] (nullable)

  __device__ void load_tables(Tables& t, int tid, int threads) const {
    for (int j = 0; j < 4; ++j) {
      const TQTensorFormat& tf = j < 2 ? f.key : f.value;
      if (j % 2 >= tf.segments) continue;
      const TQSegment& seg = tf.seg[j % 2];
      for (int i = tid; i < (1 << seg.bits); i += threads) t.c[j][i] = seg.centroids[i];
    }
  }
  __device__ int value_dim(int lane, int e) const { return lane + 32 * e; }
  __device__ void load_query(const float* q, int r, int kv_head, int b, QueryShared& qs,
                             float* scratch, int lane) const {
    load_tq_query(f, states, q, r, kv_head, b, qs, scratch, lane);
  }
  // Σ_s norm_s <R_s q_s, c_s[codes_s]>
  __device__ void score(const uint8_t* k, const uint8_t* kaux, const QueryShared& qs,
                        const Tables& t, float (&s)[kRows]) const {
#pragma unroll
    for (int sg = 0; sg < 2; ++sg) {  // constant segment index: no dynamic param indexing
      if (sg >= f.key.segments) break;
      const TQSegment& seg = f.key.seg[sg];
      const int first = seg.channel_offset;
      const float* c = t.c[sg];
      CodeReader reader(k + seg.code_offset);
      float4 d = make_float4(0, 0, 0, 0);
      for (int i = 0; i < seg.dim; ++i) fma4(d, qs.q[first + i], c[reader.next(seg.bits)]);
      add_scaled(s, d, half_at(kaux + 2 * seg.norm_index));
    }
    for (int r = 0; r < kRows; ++r) s[r] += qs.qm[r];
  }
  __device__ float value_scale(const uint8_t* vaux) const {
    return f.value.segments == 1 ? half_at(vaux) : 1.0f;
  }
  __device__ void accumulate(const uint8_t* v, const uint8_t* vaux, const float4& p,
                             const Tables& t, int lane, float (&acc)[kRows][kE]) const {
    const TQSegment& s0 = f.value.seg[0];
    const TQSegment& s1 = f.value.seg[1];
    const bool two = f.value.segments == 2;
    const int split = two ? s0.dim : f.head_dim;
    const float norm0 = two ? half_at(vaux) : 1.0f;
    const float norm1 = two ? half_at(vaux + 2) : 1.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int d = lane + 32 * e;
      if (d < f.head_dim) {
        const bool high = d >= split;  // segment 1
        const int bits = high ? s1.bits : s0.bits;
        const int bit = (high ? d - split : d) * bits;
        const uint8_t* codes = v + (high ? s1.code_offset : s0.code_offset);
        const float x = t.c[high ? 3 : 2][code_at(codes, bit, bits)] * (high ? norm1 : norm0);
        accumulate_value(acc, e, p, x);
      }
    }
  }
};

// Compile-time TurboQuant: one segment each, head_dim kDim (a multiple of 32), kKeyBits and
// kValueBits codes. A key row is loaded as words and decoded with constant shifts; lane l
// accumulates the value dims kE * l .. kE * l + kE - 1 (one funnel shift of two words).
template <int kDim, int kKeyBits, int kValueBits>
struct TQFixedCodec {
  static_assert(kDim % 32 == 0 && kDim <= kMaxHeadDim, "head_dim a multiple of 32");
  static_assert(kValueBits * (kDim / 32) <= 32, "a lane's value codes fit in a word");
  static constexpr int kE = kDim / 32;
  static constexpr int kKeyWords = kDim * kKeyBits / 32;
  static constexpr int kValueWords = kDim * kValueBits / 32;
  static constexpr bool kKeyRow16 = (kDim * kKeyBits / 8) % 16 == 0;  // else 8-B aligned rows
  struct Tables {
    float k[1 << kKeyBits];
    float v[1 << kValueBits];
  };
  TQFormat f;
  const TQSequenceState* states;  // [batch] (nullable)

  __device__ void load_tables(Tables& t, int tid, int threads) const {
    for (int i = tid; i < (1 << kKeyBits); i += threads) t.k[i] = f.key.seg[0].centroids[i];
    for (int i = tid; i < (1 << kValueBits); i += threads) t.v[i] = f.value.seg[0].centroids[i];
  }
  __device__ int value_dim(int lane, int e) const { return kE * lane + e; }
  __device__ void load_query(const float* q, int r, int kv_head, int b, QueryShared& qs,
                             float* scratch, int lane) const {
    load_tq_query(f, states, q, r, kv_head, b, qs, scratch, lane);
  }
  template <int kBits, int kWords>
  static __device__ __forceinline__ uint32_t code(const uint32_t (&w)[kWords], int i) {
    const int bit = i * kBits, word = bit / 32, shift = bit % 32;
    const uint32_t x =
        shift + kBits <= 32
            ? w[word] >> shift
            : __funnelshift_r(w[word], w[word + 1 < kWords ? word + 1 : word], shift);
    return x & ((1u << kBits) - 1);
  }
  __device__ void score(const uint8_t* k, const uint8_t* kaux, const QueryShared& qs,
                        const Tables& t, float (&s)[kRows]) const {
    uint32_t w[kKeyWords];
    if constexpr (kKeyRow16) {
#pragma unroll
      for (int i = 0; i < kKeyWords / 4; ++i) {
        const uint4 x = reinterpret_cast<const uint4*>(k)[i];
        w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kKeyWords / 2; ++i) {
        const uint2 x = reinterpret_cast<const uint2*>(k)[i];
        w[2 * i] = x.x, w[2 * i + 1] = x.y;
      }
    }
    float4 d = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < kDim; ++i) fma4(d, qs.q[i], t.k[code<kKeyBits>(w, i)]);
    add_scaled(s, d, half_at(kaux));
    for (int r = 0; r < kRows; ++r) s[r] += qs.qm[r];
  }
  __device__ float value_scale(const uint8_t* vaux) const {
    return half_at(vaux);
  }
  __device__ void accumulate(const uint8_t* v, const uint8_t*, const float4& p, const Tables& t,
                             int lane, float (&acc)[kRows][kE]) const {
    constexpr int kLaneBits = kE * kValueBits;
    const int bit = lane * kLaneBits, word = bit / 32;
    const uint32_t* row = reinterpret_cast<const uint32_t*>(v);
    const uint32_t codes =
        __funnelshift_r(row[word], row[min(word + 1, kValueWords - 1)], bit % 32);
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      accumulate_value(acc, e, p, t.v[(codes >> (e * kValueBits)) & ((1u << kValueBits) - 1)]);
    }
  }
};

}  // namespace turbokv::cuda::paged
