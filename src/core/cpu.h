// Runtime CPU feature checks that pick SIMD kernels. TURBOKV_FORCE_SCALAR=1 in the
// environment forces the portable paths (used by tests and for comparisons).
#pragma once

namespace turbokv {

// True when AVX2, FMA and F16C are all available and not disabled by the environment.
bool cpu_has_avx2();

}  // namespace turbokv
