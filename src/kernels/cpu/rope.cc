// Fast RoPE (rope.h): the cos/sin of a token's angles are computed once and applied to all its
// heads; tokens are spread over the thread pool.
#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/threads.h"

namespace turbokv {

void apply_rope(float* x, int64_t n_tokens, int n_heads, int head_dim, const int64_t* positions,
                const RopeTable& rope) {
  const int half = rope.rotary_dim() / 2;
  parallel_for(n_tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_sin(size_t(2 * half));  // [cos(half) | sin(half)]
    for (int64_t t = begin; t < end; ++t) {
      for (int i = 0; i < half; ++i) {
        const float angle = float(positions[t]) * rope.inv_freq[i];
        cos_sin[i] = float(std::cos(double(angle))) * rope.attention_scaling;
        cos_sin[half + i] = float(std::sin(double(angle))) * rope.attention_scaling;
      }
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cos_sin[i] - b * cos_sin[half + i];
          v[i + half] = b * cos_sin[i] + a * cos_sin[half + i];
        }
      }
    }
  });
}

}  // namespace turbokv
