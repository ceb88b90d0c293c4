// AVX2 RMSNorm rows (norm.h); entered only after cpu_has_avx2().
#include "kernels/cpu/norm_avx2.h"

#include <immintrin.h>

#include <cmath>

namespace turbokv::avx2 {

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps,
              float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= dim; i += 16) {
      const __m256 a = _mm256_loadu_ps(xr + i), b = _mm256_loadu_ps(xr + i + 8);
      acc0 = _mm256_fmadd_ps(a, a, acc0);
      acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    double sum_sq = _mm_cvtss_f32(s);
    for (; i < dim; ++i) sum_sq += double(xr[i]) * xr[i];
    const float inv_rms = float(1.0 / std::sqrt(sum_sq / double(dim) + double(eps)));
    const __m256 scale = _mm256_set1_ps(inv_rms);
    float* o = out + r * dim;
    i = 0;
    for (; i + 8 <= dim; i += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xr + i), scale);
      _mm256_storeu_ps(o + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
    }
    for (; i < dim; ++i) o[i] = (xr[i] * inv_rms) * weight[i];
  }
}

}  // namespace turbokv::avx2
