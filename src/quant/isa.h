// Which instruction set a codec kernel runs on. Every kernel has a scalar reference
// (Isa::kScalar) and, on x86-64 with AVX2+FMA+F16C, an AVX2 version. Callers normally take
// best_isa(); tests pass both explicitly and compare.
#pragma once

#include "core/cpu.h"

namespace turbokv::quant {

enum class Isa { kScalar, kAvx2 };

// kAvx2 when the CPU has it (and TURBOKV_FORCE_SCALAR is not set), else kScalar.
inline Isa best_isa() {
  return cpu_has_avx2() ? Isa::kAvx2 : Isa::kScalar;
}

// Maps a requested Isa to one this CPU can run (kAvx2 -> kScalar without AVX2).
inline Isa usable_isa(Isa isa) {
  return isa == Isa::kAvx2 && !cpu_has_avx2() ? Isa::kScalar : isa;
}

}  // namespace turbokv::quant
