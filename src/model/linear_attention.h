// Gated DeltaNet (qwen3_5 linear-attention layers), as separate steps that a CUDA version can be
// tested against one by one. Per value head h (key head h / (Hv / Hk)), token t:
//   S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - (exp(g_t) S_{t-1})ᵀ k_t))ᵀ     S: [dk, dv]
//   o_t = S_tᵀ q_t
// with q, k L2-normalized and q scaled by dk^-1/2 beforehand (gated_delta_prepare).
//   gated_delta_recurrent : the recurrence token by token (decode, and any length)
//   gated_delta_chunked   : the chunked (UT-transform) form for prefill: per chunk of C tokens,
//                           intra-chunk attention by matmuls, one state update per chunk
//   gated_delta_ref       : slow reference in double: S_t = exp(g_t)(I - beta_t k_t k_tᵀ)
//                           S_{t-1} + beta_t k_t v_tᵀ with the transition matrix formed
#pragma once

#include <cstdint>

namespace turbokv {

struct GatedDeltaShape {
  int key_heads = 0;
  int value_heads = 0;  // a multiple of key_heads
  int k_dim = 0;
  int v_dim = 0;
};

// Depthwise causal conv1d over channels, then SiLU, continuing from `history`.
//   x: [T, C] in; out: [T, C] (may not alias x)
//   weight: [C, K] (conv1d.weight [C, 1, K]); history: [K-1, C], oldest first, updated to the
//   last K-1 inputs.
void causal_conv1d_silu(const float* x, int64_t T, int C, int K, const float* weight,
                        float* history, float* out);

// From the conv output and the raw gate inputs to the delta rule's operands, in place:
//   qkv: [T, 2*Hk*dk + Hv*dv] = [q | k | v]; q, k L2-normalized (eps 1e-6), q *= dk^-1/2
//   a, b: [T, Hv] -> g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
void gated_delta_prepare(float* qkv, float* a, float* b, int64_t T, const GatedDeltaShape& s,
                         const float* a_log, const float* dt_bias);

// q, k: row stride `qk_stride` floats per token, heads [Hk, dk] at q, k; v: stride `v_stride`,
// [Hv, dv]; g, beta: [T, Hv]; state: [Hv, dk, dv] updated; out: [T, Hv, dv].
struct GatedDeltaInputs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t qk_stride = 0;
  int64_t v_stride = 0;
  const float* g = nullptr;
  const float* beta = nullptr;
  int64_t T = 0;
};
void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state,
                           float* out);
void gated_delta_chunked(const GatedDeltaInputs& in, const GatedDeltaShape& s, int chunk,
                         float* state, float* out);
void gated_delta_ref(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state,
                     float* out);

// out[t, h, :] = w * rmsnorm(x[t, h, :]) * silu(z[t, h, :]) per head of dim d (in place on x).
void gated_rms_norm(float* x, const float* z, int64_t rows, int d, const float* w, float eps);

}  // namespace turbokv
