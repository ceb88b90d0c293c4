// AVX2 activations (activation.h) on the shared vector exp (exp_avx2.h).
#include "kernels/cpu/activation_avx2.h"

#include <immintrin.h>

#include "kernels/cpu/exp_avx2.h"

namespace turbokv::avx2 {
namespace {

// tanh(y) = 1 - 2 / (exp(2y) + 1)
inline __m256 tanh8(__m256 y) {
  const __m256 e = exp8(_mm256_add_ps(y, y));
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}

inline __m256 activate8(__m256 g, Activation act) {
  const __m256 one = _mm256_set1_ps(1.0f);
  if (act == Activation::kSilu) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_div_ps(g, _mm256_add_ps(one, e));
  }
  const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                     _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), _mm256_add_ps(one, tanh8(inner)));
}

}  // namespace

void gated_activation(const float* gate, const float* up, int64_t n, Activation act, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = activate8(_mm256_loadu_ps(gate + i), act);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(a, _mm256_loadu_ps(up + i)));
  }
  if (i < n) gated_activation_ref(gate + i, up + i, n - i, act, out + i);
}

void softcap(float* x, int64_t n, float cap) {
  const __m256 c = _mm256_set1_ps(cap), inv_c = _mm256_set1_ps(1.0f / cap);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh8(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv_c))));
  }
  if (i < n) softcap_ref(x + i, n - i, cap);
}

}  // namespace turbokv::avx2
