// Rotary position embedding in Hugging Face's "rotate_half" layout: within the first
// rotary_dim dimensions of a head, dims i and i + rotary_dim/2 form a rotated pair with angle
// position * inv_freq[i]; the remaining dims (partial rotary) pass through.
//   apply_rope     : fast path (cos/sin computed once per token, shared by all heads)
//   apply_rope_ref : scalar reference, recomputes every angle
// Both compute angles in f32 (position * inv_freq) and cos/sin of that angle, like transformers.
#pragma once

#include <cstdint>
#include <vector>

namespace turbokv {

struct RopeTable {
  std::vector<float> inv_freq;  // [rotary_dim / 2]
  float attention_scaling = 1;  // multiplies cos and sin (YaRN's attention factor)
  int rotary_dim() const { return int(inv_freq.size()) * 2; }
};

// x: [n_tokens, n_heads, head_dim], rotated in place; positions: [n_tokens].
void apply_rope(float* x, int64_t n_tokens, int n_heads, int head_dim, const int64_t* positions,
                const RopeTable& rope);
void apply_rope_ref(float* x, int64_t n_tokens, int n_heads, int head_dim, const int64_t* positions,
                    const RopeTable& rope);

}  // namespace turbokv
