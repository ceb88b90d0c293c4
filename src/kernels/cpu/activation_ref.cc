// Scalar references of activation.h.
#include <cmath>

#include "kernels/cpu/activation.h"

namespace turbokv {

void gated_activation_ref(const float* gate, const float* up, int64_t n, Activation act,
                          float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float a = act == Activation::kSilu
                        ? g / (1.0f + std::exp(-g))
                        : 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
    out[i] = a * up[i];
  }
}

void softcap_ref(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

}  // namespace turbokv
