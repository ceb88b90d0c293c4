// Entry points of qmatmul_avx512.cc (compiled with AVX-512 F/BW/VL/DQ and VNNI): call only
// after qmatmul_vnni_available().
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace turbokv::avx512 {

// Whether the CPU and OS run the AVX-512 VNNI kernels (cpu_has_avx512() and VNNI).
bool qmatmul_vnni_available();
// Whether qmatmul_rows has a kernel for w: every GGUF format, MLX 4 and 8 bits, with cols a
// multiple of 64.
bool qmatmul_supported(const WeightMatrix& w);
// As avx2::qmatmul_rows (x from quantize_activations, any number of rows), y rows w.rows long.
void qmatmul_rows(const ActivationBlocks& x, const WeightMatrix& w, int64_t row_begin,
                  int64_t row_end, float* y);

}  // namespace turbokv::avx512
