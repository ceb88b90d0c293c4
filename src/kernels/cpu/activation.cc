// Activation dispatch (activation.h): AVX2 when available, else the scalar references.
#include "kernels/cpu/activation.h"

#include "core/cpu.h"
#include "kernels/cpu/activation_avx2.h"

namespace turbokv {

void gated_activation(const float* gate, const float* up, int64_t n, Activation act, float* out) {
  if (cpu_has_avx2()) {
    avx2::gated_activation(gate, up, n, act, out);
  } else {
    gated_activation_ref(gate, up, n, act, out);
  }
}

void softcap(float* x, int64_t n, float cap) {
  if (cpu_has_avx2()) {
    avx2::softcap(x, n, cap);
  } else {
    softcap_ref(x, n, cap);
  }
}

}  // namespace turbokv
