// Entry points of qmatmul_avx2.cc (compiled with AVX2/FMA/F16C): call only after cpu_has_avx2().
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace turbokv::avx2 {

// Whether qmatmul_rows has a kernel for w's format (all GGUF formats, MLX 4 and 8 bits).
bool qmatmul_supported(const WeightMatrix& w);
// y[i, n] = Σ_k w[n, k] · x[i, k] for the int8 activation rows of x (at most 8),
// n in [row_begin, row_end); y rows are w.rows long. As qmatmul_rows_ref up to f32 rounding.
void qmatmul_rows(const ActivationBlocks& x, const WeightMatrix& w, int64_t row_begin,
                  int64_t row_end, float* y);

}  // namespace turbokv::avx2
