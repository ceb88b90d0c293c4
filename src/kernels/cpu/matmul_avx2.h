// Entry points of matmul_avx2.cc (compiled with AVX2/FMA/F16C): call only after cpu_has_avx2().
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace turbokv::avx2 {

// y[i, n] = <x[i, :], w[n, :]> for i in [0, m), n in [row_begin, row_end); y rows are w.rows long.
void matmul_rows(const float* x, int64_t m, const WeightMatrix& w, int64_t row_begin,
                 int64_t row_end, float* y);
// As widen_rows (matmul.h).
void widen_rows(const WeightMatrix& w, int64_t begin, int64_t count, float* out);

}  // namespace turbokv::avx2
