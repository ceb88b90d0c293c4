// RMSNorm dispatch (norm.h): AVX2 when available, else the scalar reference.
#include "kernels/cpu/norm.h"

#include "core/cpu.h"
#include "kernels/cpu/norm_avx2.h"

namespace turbokv {

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps,
              float* out) {
  if (cpu_has_avx2()) {
    avx2::rms_norm(x, rows, dim, weight, eps, out);
  } else {
    rms_norm_ref(x, rows, dim, weight, eps, out);
  }
}

}  // namespace turbokv
