// AVX2 activations (activation.h) on a vector exp: Cody–Waite range reduction to
// r in [-ln2/2, ln2/2] and a degree-5 polynomial (Cephes expf), about 1 ulp.
#include "kernels/cpu/activation_avx2.h"

#include <immintrin.h>

namespace turbokv::avx2 {
namespace {

inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

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
