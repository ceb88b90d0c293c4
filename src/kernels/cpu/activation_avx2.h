// Entry points of activation_avx2.cc (AVX2/FMA): call only after cpu_has_avx2().
#pragma once

#include <cstdint>

#include "kernels/cpu/activation.h"

namespace turbokv::avx2 {

void gated_activation(const float* gate, const float* up, int64_t n, Activation act, float* out);
void softcap(float* x, int64_t n, float cap);

}  // namespace turbokv::avx2
