// Multi-head latent attention (deepseek_v3) as small steps a CUDA version can be tested
// against. The cache keeps per token one latent row [c | k_rope] (kv_lora_rank +
// qk_rope_head_dim) shared by all heads; attention runs in latent space:
//   score_h(t, s) = <W_uk,h q_nope,h(t), c(s)> + <q_rope,h(t), k_rope(s)>  (= <q_h, k_h> of the
//   expanded form), out_h(t) = W_uv,h Σ_s p_h(t, s) c(s).
// The latent cache is attended as one KV head of dim latent_dim with V = the same row: the
// value part of the output is its first kv_lora_rank dims.
#pragma once

#include <cstdint>

namespace turbokv {

// Rotary dims stored as adjacent pairs (x0, x1, x2, ...) to rotate_half layout
// (x0, x2, ..., x1, x3, ...), for rows of dim d (even), in place: x [rows, d].
void deinterleave_pairs(float* x, int64_t rows, int d);

}  // namespace turbokv
