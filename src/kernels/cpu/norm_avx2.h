// Entry point of norm_avx2.cc (compiled with AVX2/FMA): call only after cpu_has_avx2().
#pragma once

#include <cstdint>

namespace turbokv::avx2 {

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps,
              float* out);

}  // namespace turbokv::avx2
