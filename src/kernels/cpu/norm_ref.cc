// Scalar reference RMSNorm (norm.h).
#include <cmath>

#include "kernels/cpu/norm.h"

namespace turbokv {

void rms_norm_ref(const float* x, int64_t rows, int64_t dim, const float* weight, float eps,
                  float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double sum_sq = 0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += double(xr[i]) * xr[i];
    const float inv_rms = float(1.0 / std::sqrt(sum_sq / double(dim) + double(eps)));
    float* o = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = (xr[i] * inv_rms) * weight[i];
  }
}

}  // namespace turbokv
