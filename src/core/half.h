// IEEE fp16 and bfloat16 <-> fp32 conversions, bit-exact (round to nearest even), scalar.
// The SIMD paths (F16C) must agree with these bit for bit; tests check it.
#pragma once

#include <cstdint>
#include <cstring>

namespace turbokv {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // subnormal: normalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return bits_float(sign | (uint32_t(127 - 15 - e) << 23) | (mant << 13));
  }
  return bits_float(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // nan
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (incl. rounding) -> inf
  if (abs < 0x38800000u) {                                  // result is subnormal or zero
    if (abs < 0x33000000u) return sign;                     // < half of smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t s = 126 - exp;
    uint32_t r = mant >> s;
    const uint32_t rem = mant & ((1u << s) - 1);
    const uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

}  // namespace turbokv
