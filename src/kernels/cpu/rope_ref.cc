// Scalar reference RoPE (rope.h): one angle, cos and sin per rotated pair.
#include <cmath>

#include "kernels/cpu/rope.h"

namespace turbokv {

void apply_rope_ref(float* x, int64_t n_tokens, int n_heads, int head_dim, const int64_t* positions,
                    const RopeTable& rope) {
  const int half = rope.rotary_dim() / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float angle = float(positions[t]) * rope.inv_freq[i];
        const float c = float(std::cos(double(angle))) * rope.attention_scaling;
        const float s = float(std::sin(double(angle))) * rope.attention_scaling;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace turbokv
