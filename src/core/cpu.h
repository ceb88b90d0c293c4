// Runtime CPU feature checks that pick SIMD kernels. In the environment,
// TURBOKV_FORCE_SCALAR=1 forces the portable paths and TURBOKV_FORCE_AVX2=1 keeps kernels
// off AVX-512 (both for tests and comparisons on one machine).
#pragma once

namespace turbokv {

// An environment switch such as TURBOKV_FORCE_SCALAR: set, not empty and not "0".
bool env_flag(const char* name);

// True when AVX2, FMA and F16C are all available and not disabled by the environment.
bool cpu_has_avx2();
// True when cpu_has_avx2() and the CPU and OS support AVX-512 F, BW, VL and DQ, unless
// TURBOKV_FORCE_AVX2 is set.
bool cpu_has_avx512();
// The x86 SIMD features kernels look at or a benchmark reader needs, as "avx2 fma f16c
// avx512f ..." (those present; "none"). avxvnni (256-bit VNNI without AVX-512) is reported,
// no kernel uses it.
const char* cpu_feature_names();

}  // namespace turbokv
