// The model's elementwise and row kernels on the GPU (everything of a decoder layer but the
// GEMMs, which go through cuBLAS, and attention). Each has a CPU counterpart in
// src/kernels/cpu (norm.h, rope.h, activation.h, matmul.h's gather_rows) or src/model
// (the MoE routing) that the tests compare it with. All pointers are device pointers; work is
// queued on `stream`. Activations are fp32; GEMM inputs may be narrowed to the weights' type.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/activation.h"

namespace turbokv::cuda {

// Element type of a weight matrix or of a GEMM operand.
enum class Elem : uint8_t { kF32, kF16, kBF16 };
size_t elem_bytes(Elem e);

// out[i, :] = scale * table[ids[i], :] as fp32; table [rows, cols] of elem.
void embed_rows(const void* table, Elem elem, int64_t cols, const int32_t* ids, int64_t n,
                float scale, float* out, cudaStream_t stream);

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight, narrowed to out_elem (out may
// be x when out_elem is kF32). x [rows, dim] fp32; weight [dim] fp32 (gemma's 1 + w folded in).
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps,
              void* out, Elem out_elem, cudaStream_t stream);

// The step after the fused QKV projection: qkv [T, q_dim + 2 kv_dim] fp32 (q | k | v columns)
// -> q [T, heads, head_dim], k, v [T, kv_heads, head_dim] fp32, with
//   + bias [q_dim + 2 kv_dim] (optional), RMSNorm of each q and k head (optional weights
//   [head_dim]), and rotate-half RoPE of q and k over the first rotary_dim dims:
//   angle = float(position) * inv_freq[i], (x_i, x_{i + r/2}) rotated by it, cos and sin
//   multiplied by attention_scaling.
struct QkvPostProblem {
  const float* qkv = nullptr;
  const float* bias = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float norm_eps = 0;
  const int32_t* positions = nullptr;  // [T]
  const float* inv_freq = nullptr;     // [rotary_dim / 2]
  int rotary_dim = 0;
  float attention_scaling = 1;
  int64_t tokens = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  float* q = nullptr;
  float* k = nullptr;
  float* v = nullptr;
};
void qkv_post(const QkvPostProblem& p, cudaStream_t stream);

// out[r, i] = act(gate[r, i] + gate_bias[i]) * (up[r, i] + up_bias[i]) narrowed to out_elem,
// with gate_up [rows, 2 * inter] fp32 (gate columns first, then up; one fused GEMM); biases
// optional.
void gated_activation(const float* gate_up, int64_t rows, int64_t inter, const float* gate_bias,
                      const float* up_bias, Activation act, void* out, Elem out_elem,
                      cudaStream_t stream);

// x[r, :] += post(y[r, :] + bias), post = RMSNorm with post_norm (sandwich norms) or identity.
// x, y [rows, dim] fp32; bias, post_norm [dim] optional.
void residual_add(float* x, const float* y, int64_t rows, int64_t dim, const float* bias,
                  const float* post_norm, float eps, cudaStream_t stream);

// residual_add without post norm followed by rms_norm of the new x, in one kernel with the
// same results: x[r, :] += y[r, :] + bias; out[r, :] = rms_norm(x[r, :]) * weight narrowed to
// out_elem.
void residual_add_norm(float* x, const float* y, int64_t rows, int64_t dim, const float* bias,
                       const float* weight, float eps, void* out, Elem out_elem,
                       cudaStream_t stream);

// out = x narrowed to elem (a copy when elem is kF32).
void cast(const float* x, int64_t n, void* out, Elem elem, cudaStream_t stream);

// x = cap * tanh(x / cap), in place.
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// out[i, :] = x[rows[i], :] (fp32, [n, dim]).
void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out,
                 cudaStream_t stream);

// out[i] = argmax of logits[i, :] (lowest index on ties; NaN never wins).
void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out,
                 cudaStream_t stream);

// Qwen3-MoE routing of logits [tokens, experts]: softmax (max-shifted, the sum in double),
// the top_k experts (ties: lower index first), weights renormalized over the top_k when
// norm_topk. experts, weights [tokens, top_k]. experts <= 1024.
void moe_route(const float* logits, int64_t tokens, int experts, int top_k, bool norm_topk,
               int32_t* expert_ids, float* weights, cudaStream_t stream);

// out[token[i], :] += weight[i] * y[i, :] for i in [0, n) (rows of one expert: no token twice).
void scatter_add_weighted(float* out, const float* y, const int32_t* token, const float* weight,
                          int64_t n, int64_t dim, cudaStream_t stream);

// out[i] = stddev * N(0, 1) from a counter-based generator (seed, i): synthetic keys and values
// for benchmarks that fill a cache to a depth without a prefill.
void fill_normal(float* out, int64_t n, uint64_t seed, float stddev, cudaStream_t stream);

}  // namespace turbokv::cuda
