// fp16/bf16 conversions against the hardware F16C instructions (an implementation we did not
// write) over every half value and a sweep of floats.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <random>

#include "core/cpu.h"
#include "core/half.h"

namespace turbokv {
namespace {

__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) {
  return uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

TEST(Half, EveryHalfDecodesLikeF16C) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = f16_to_f32(uint16_t(h)), hw = hw_f16_to_f32(uint16_t(h));
    if (std::isnan(hw)) {
      EXPECT_TRUE(std::isnan(ours)) << h;
    } else {
      EXPECT_EQ(float_bits(ours), float_bits(hw)) << "half " << h;
    }
  }
}

TEST(Half, FloatsEncodeLikeF16C) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    // Exponents from far below the subnormal range to beyond the max half.
    const uint32_t bits = (rng() & 0x807fffffu) | (uint32_t(90 + rng() % 60) << 23);
    const float f = bits_float(bits);
    ASSERT_EQ(f32_to_f16(f), hw_f32_to_f16(f)) << "float bits " << bits;
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, 5.96e-8f, 2.98e-8f, INFINITY}) {
    EXPECT_EQ(f32_to_f16(f), hw_f32_to_f16(f)) << f;
  }
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits_float(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(bits_float(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(bits_float(0x3f808001u)), 0x3f81);
  EXPECT_FLOAT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

}  // namespace
}  // namespace turbokv
