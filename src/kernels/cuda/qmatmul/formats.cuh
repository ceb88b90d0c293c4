// Device-side decoding of the weight formats of kernels/cpu/qweights.h, as traits shared by
// the GEMV and dequantize kernels. One lane's work item is a *unit*: kSpan values of one row
// (all of a 32-block; a 64-value chunk of a Q4_K super-block; two 32-value runs of a Q6_K
// super-block; 32 values of an MLX row), read with as few wide loads as the layout allows.
// A trait provides
//   Unit load(w, row, u)      the unit's bytes (and scales) of row `row`, unit index u,
//   first_col(u), col(v)      the column of the unit's value 0, and of value v relative to it,
//   value(unit, v)            the integer code of value v as an exact float, the format's
//                             constant offset applied (Q4_0: q - 8, Q6_K: q - 32, ...),
//   scale(unit, s)            the multiplier of sub-block s (kSub consecutive values),
//   offset(unit, s)           its additive term (kHasOffset: Q4_K's -dmin·m, MLX's bias),
// so that w = scale · value (+ offset) with the operations and rounding of
// dequantize_rows_ref. Units never straddle 256-column boundaries.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/qmatmul/params.h"

namespace turbokv::cuda::qmm {

constexpr float kMagic = 8388608.0f;  // 2^23: float(2^23 + b) has b in its low mantissa bits

// Byte k (0..3, a constant after unrolling) of w as an exact float, minus `bias` - kMagic:
// one PRMT that builds the float 2^23 + byte and one FADD, cheaper than an int -> float
// conversion. bias = kMagic + c gives byte - c exactly (both operands are in [2^23, 2^24)).
__device__ __forceinline__ float byte_value(uint32_t w, int k, float bias) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | uint32_t(k))) - bias;
}

__device__ __forceinline__ float f16_bits_value(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}
__device__ __forceinline__ float bf16_bits_value(uint32_t h) {
  return __uint_as_float(h << 16);
}

__device__ __forceinline__ uint4 load16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

// The 4N bytes at p (2-byte aligned) as little-endian words, read as aligned 16-byte loads of
// [p & ~15, (p & ~15) + 16 * kChunks) (up to 30 bytes past p + 4N) and realigned in
// registers: a two-step word shift by (p & 15) / 4 and a funnel shift by (p & 3) bytes.
template <int N>
__device__ __forceinline__ void load_unaligned(const uint8_t* p, uint32_t (&out)[N]) {
  constexpr int kChunks = (4 * N + 14 + 15) / 16;  // covers offsets up to 14 plus 4N bytes
  constexpr int kWords = 4 * kChunks;              // >= N + 4: index word_shift + N is valid
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  const uint8_t* base = p - (address & 15);
  uint32_t w[kWords];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const uint4 v = load16(base + 16 * c);
    w[4 * c] = v.x;
    w[4 * c + 1] = v.y;
    w[4 * c + 2] = v.z;
    w[4 * c + 3] = v.w;
  }
  const int word_shift = int(address & 15) >> 2;  // 0..3
#pragma unroll
  for (int i = 0; i + 1 < kWords; ++i) w[i] = (word_shift & 1) ? w[i + 1] : w[i];
#pragma unroll
  for (int i = 0; i + 2 < kWords; ++i) w[i] = (word_shift & 2) ? w[i + 2] : w[i];
  const uint32_t byte_shift = 8u * uint32_t(address & 3);  // 0 or 16
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = __funnelshift_r(w[i], w[i + 1], byte_shift);
}

constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

// Bits 0..3 of t moved to bit 0 of bytes 0..3 (the four shifted copies do not overlap).
__device__ __forceinline__ uint32_t spread_bits(uint32_t t) {
  return (t * 0x00204081u) & 0x01010101u;
}

// The GGUF 32-value blocks { f16 d; kWords words of codes } (Q8_0, Q4_0, Q5_0), 2-byte
// aligned: w = d·value. Unit = one block.
template <int kBlockBytes, int kWords>
struct Block32 {
  static constexpr int kSpan = 32, kSub = 32, kXGroup = 32, kUnroll = 2;
  static constexpr bool kHasOffset = false;
  struct Unit {
    uint32_t w[kWords];
    float d;
  };
  __device__ static int64_t first_col(int64_t u) { return 32 * u; }
  __device__ static constexpr int col(int v) { return v; }
  __device__ static Unit load(const WeightArgs& w, int64_t row, int64_t u) {
    const uint8_t* b = w.data + row * w.row_bytes + kBlockBytes * u;
    Unit x;
    x.d = f16_bits_value(load_u16(b));
    load_unaligned(b + 2, x.w);
    return x;
  }
  __device__ static float scale(const Unit& x, int) { return x.d; }
  __device__ static float offset(const Unit&, int) { return 0.0f; }
};

// The nibbles of value v's word among 16 bytes qs[0..3] of Q4_0 / Q5_0 codes: value j < 16 is
// the low nibble of byte j, value j + 16 its high nibble.
__device__ __forceinline__ uint32_t block_nibbles(const uint32_t* qs, int v) {
  return v < 16 ? qs[v / 4] & kLowNibbles : (qs[(v - 16) / 4] >> 4) & kLowNibbles;
}

// ---- GGUF Q8_0: 32 values, { f16 d; int8 q[32] }, w = d·q.
struct FormatQ8_0 : Block32<34, 8> {
  __device__ static float value(const Unit& x, int v) {
    // q + 128 as an unsigned byte: the sign bit flipped.
    return byte_value(x.w[v / 4] ^ 0x80808080u, v % 4, kMagic + 128.0f);
  }
};

// ---- GGUF Q4_0: 32 values, { f16 d; u8 qs[16] }, w = d·(q - 8).
struct FormatQ4_0 : Block32<18, 4> {
  __device__ static float value(const Unit& x, int v) {
    return byte_value(block_nibbles(x.w, v), v % 4, kMagic + 8.0f);
  }
};

// ---- GGUF Q5_0: 32 values, { f16 d; u32 qh; u8 qs[16] }, w = d·(q - 16); the nibbles as in
// Q4_0, bit j of qh is bit 4 of value j.
struct FormatQ5_0 : Block32<22, 5> {  // w[0] = qh, w[1..4] = qs
  __device__ static float value(const Unit& x, int v) {
    // Values v & ~3 .. (v & ~3) + 3 take bits 4 * (v / 4) .. + 3 of qh (also for v >= 16).
    const uint32_t high = spread_bits((x.w[0] >> (4 * (v / 4))) & 0xFu) << 4;
    return byte_value(block_nibbles(x.w + 1, v) | high, v % 4, kMagic + 16.0f);
  }
};

// Scales and mins of sub-blocks 2c and 2c + 1 (c = 0..3, per lane) of a Q4_K block from its
// 12 scale bytes s[0..2], as two bytes each (sub-block 2c in byte 0, 2c + 1 in byte 1): 6
// bits; for sub-blocks j < 4 the low 6 bits of bytes j (scale) and j + 4 (min); for j >= 4 the
// low / high nibble of byte j + 4 below the top 2 bits of byte j - 4 (scale) / byte j (min).
__device__ __forceinline__ void q4_k_scales_mins(const uint32_t (&s)[3], int c, uint32_t& sc,
                                                 uint32_t& m) {
  const uint32_t shift = 16u * uint32_t(c & 1);
  const uint32_t a0 = s[0] >> shift, a1 = s[1] >> shift, a2 = s[2] >> shift;
  if (c < 2) {
    sc = a0 & 0x3F3Fu;
    m = a1 & 0x3F3Fu;
  } else {
    sc = (a2 & 0x0F0Fu) | ((a0 >> 2) & 0x3030u);
    m = ((a2 >> 4) & 0x0F0Fu) | ((a1 >> 2) & 0x3030u);
  }
}

// ---- GGUF Q4_K: 256 values, 144 bytes { f16 d, dmin; u8 scales[12]; u8 qs[128] }; 8
// sub-blocks of 32 with 6-bit scale sc and min m: w = d·sc·q - dmin·m. Unit = chunk c of
// block b (u = 4b + c): qs[32c .. 32c + 32) holds values 64c + l (low nibbles, sub-block 2c)
// and 64c + 32 + l (high nibbles, sub-block 2c + 1). Blocks are 16-byte aligned.
struct FormatQ4_K {
  static constexpr int kSpan = 64, kSub = 32, kXGroup = 64, kUnroll = 2;
  static constexpr bool kHasOffset = true;
  struct Unit {
    uint32_t qs[8];
    float scale[2], offset[2];
  };
  __device__ static int64_t first_col(int64_t u) { return 64 * u; }
  __device__ static constexpr int col(int v) { return v; }
  __device__ static Unit load(const WeightArgs& w, int64_t row, int64_t u) {
    const uint8_t* b = w.data + row * w.row_bytes + 144 * (u >> 2);
    const int c = int(u & 3);
    const uint4 head = load16(b);
    const uint4 q0 = load16(b + 16 + 32 * c), q1 = load16(b + 32 + 32 * c);
    Unit x = {{q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w}, {}, {}};
    const float d = f16_bits_value(head.x & 0xFFFFu), dmin = f16_bits_value(head.x >> 16);
    const uint32_t s[3] = {head.y, head.z, head.w};
    uint32_t sc, m;
    q4_k_scales_mins(s, c, sc, m);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      x.scale[half] = d * byte_value(sc, half, kMagic);
      x.offset[half] = -(dmin * byte_value(m, half, kMagic));
    }
    return x;
  }
  __device__ static float value(const Unit& x, int v) {
    const uint32_t nibbles =
        v < 32 ? x.qs[v / 4] & kLowNibbles : (x.qs[(v - 32) / 4] >> 4) & kLowNibbles;
    return byte_value(nibbles, v % 4, kMagic);
  }
  __device__ static float scale(const Unit& x, int s) {
    return x.scale[s];
  }
  __device__ static float offset(const Unit& x, int s) {
    return x.offset[s];
  }
};

// ---- GGUF Q6_K: 256 values, 210 bytes { u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d };
// 16 sub-blocks of 16: w = d·sc·(q - 32). Value e = 128h + 32r + l (h < 2, r < 4, l < 32):
// low 4 bits from ql[64h + 32(r & 1) + l] (low nibble for r < 2, high for r >= 2), top 2 bits
// from qh[32h + l] >> 2r. Unit u = 4b + 2h + p: runs r = p and r = p + 2 of half h of block
// b, which share the 32 bytes ql[64h + 32p ..] and the 32 bytes qh[32h ..]. Blocks are only
// 2-byte aligned.
struct FormatQ6_K {
  static constexpr int kSpan = 64, kSub = 16, kXGroup = 32, kUnroll = 1;
  static constexpr bool kHasOffset = false;
  struct Unit {
    uint32_t ql[8], qh[8];
    float scale[4];  // sub-blocks of values 0-15, 16-31 (run p), 32-47, 48-63 (run p + 2)
    uint32_t shift;  // 2p: run p's top bits are qh >> 2p, run p + 2's qh >> (2p + 4)
  };
  __device__ static int64_t first_col(int64_t u) {
    return 256 * (u >> 2) + 128 * ((u >> 1) & 1) + 32 * (u & 1);
  }
  __device__ static constexpr int col(int v) { return v < 32 ? v : v + 32; }
  __device__ static Unit load(const WeightArgs& w, int64_t row, int64_t u) {
    const uint8_t* b = w.data + row * w.row_bytes + 210 * (u >> 2);
    const int h = int(u >> 1) & 1, p = int(u & 1);
    Unit x;
    load_unaligned(b + 64 * h + 32 * p, x.ql);
    load_unaligned(b + 128 + 32 * h, x.qh);
    uint32_t sc[2];  // scales[8h + 2p .. 8h + 2p + 8): bytes 0, 1, 4, 5 are this unit's
    load_unaligned(b + 192 + 8 * h + 2 * p, sc);
    const float d = f16_bits_value(load_u16(b + 208));
    const uint32_t flipped0 = sc[0] ^ 0x80808080u, flipped1 = sc[1] ^ 0x80808080u;
    x.scale[0] = d * byte_value(flipped0, 0, kMagic + 128.0f);
    x.scale[1] = d * byte_value(flipped0, 1, kMagic + 128.0f);
    x.scale[2] = d * byte_value(flipped1, 0, kMagic + 128.0f);
    x.scale[3] = d * byte_value(flipped1, 1, kMagic + 128.0f);
    x.shift = 2u * uint32_t(p);
    return x;
  }
  __device__ static float value(const Unit& x, int v) {
    const int run = v / 32, l = v % 32;
    const uint32_t low = run == 0 ? x.ql[l / 4] & kLowNibbles : (x.ql[l / 4] >> 4) & kLowNibbles;
    const uint32_t high = ((x.qh[l / 4] >> (x.shift + 4u * uint32_t(run))) & 0x03030303u) << 4;
    return byte_value(low | high, l % 4, kMagic + 32.0f);
  }
  __device__ static float scale(const Unit& x, int s) { return x.scale[s]; }
  __device__ static float offset(const Unit&, int) { return 0.0f; }
};

// ---- MLX affine, kBits in {2, 4, 8}: uint32 words of LSB-first codes (value j of a word at
// bits [j·bits, (j + 1)·bits)), per group of group_size (>= 32) a scale s and bias b:
// w = s·q + b. Unit = 32 values: 4·kBits bytes of codes, one group.
template <int kBits>
struct FormatAffine {
  static constexpr int kSpan = 32, kSub = 32, kXGroup = 32, kUnroll = 2;
  static constexpr bool kHasOffset = true;
  static constexpr int kPerWord = 32 / kBits, kPerByte = 8 / kBits;
  static constexpr uint32_t kByteMask = (1u << kBits) - 1u;
  struct Unit {
    uint32_t w[kBits];
    float s, b;
  };
  __device__ static int64_t first_col(int64_t u) { return 32 * u; }
  __device__ static constexpr int col(int v) { return v; }
  __device__ static Unit load(const WeightArgs& w, int64_t row, int64_t u) {
    const uint8_t* codes = w.data + row * w.row_bytes + 4 * kBits * u;
    Unit x;
    if constexpr (kBits == 2) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(codes));
      x.w[0] = v.x;
      x.w[1] = v.y;
    } else {
#pragma unroll
      for (int c = 0; c < kBits / 4; ++c) {
        const uint4 v = load16(codes + 16 * c);
        x.w[4 * c] = v.x;
        x.w[4 * c + 1] = v.y;
        x.w[4 * c + 2] = v.z;
        x.w[4 * c + 3] = v.w;
      }
    }
    const int64_t group = row * w.groups + (u >> w.group_shift);
    const uint32_t s = load_u16(w.scales + 2 * group), b = load_u16(w.biases + 2 * group);
    x.s = w.scales_bf16 ? bf16_bits_value(s) : f16_bits_value(s);
    x.b = w.scales_bf16 ? bf16_bits_value(b) : f16_bits_value(b);
    return x;
  }
  __device__ static float value(const Unit& x, int v) {
    // Byte k of a word holds values k·kPerByte + t at bits t·kBits of the byte.
    const int j = v % kPerWord, t = j % kPerByte;
    const uint32_t lanes = (x.w[v / kPerWord] >> (t * kBits)) & (kByteMask * 0x01010101u);
    return byte_value(lanes, j / kPerByte, kMagic);
  }
  __device__ static float scale(const Unit& x, int) {
    return x.s;
  }
  __device__ static float offset(const Unit& x, int) {
    return x.b;
  }
};

}  // namespace turbokv::cuda::qmm
