// Elementwise activations of the MLP and logit soft-capping.
//   gated_activation : out = act(gate) * up (SwiGLU / GeGLU), AVX2 when available
//   softcap          : x = cap * tanh(x / cap) (gemma2 final logits)
// *_ref are the scalar references (std::exp / std::tanh) the fast paths are tested against.
#pragma once

#include <cstdint>

namespace turbokv {

enum class Activation {
  kSilu,      // x * sigmoid(x)                        ("silu", "swish")
  kGeluTanh,  // 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))  ("gelu_pytorch_tanh")
};

// gate, up, out: [n]. out may alias gate or up.
void gated_activation(const float* gate, const float* up, int64_t n, Activation act, float* out);
void gated_activation_ref(const float* gate, const float* up, int64_t n, Activation act,
                          float* out);

// x: [n], in place.
void softcap(float* x, int64_t n, float cap);
void softcap_ref(float* x, int64_t n, float cap);

}  // namespace turbokv
