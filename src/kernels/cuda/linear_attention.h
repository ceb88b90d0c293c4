// Gated DeltaNet (qwen3_5 linear-attention layers) on the GPU: the device counterparts of the
// steps in model/linear_attention.h, which the tests compare them with one by one. All pointers
// are device pointers, fp32; work is queued on `stream`.
//   causal_conv1d_silu    : depthwise causal conv over one sequence's rows, continuing from
//                           and updating its history, then SiLU
//   gated_delta_prepare   : q, k L2-normalized (q also scaled by dk^-1/2), g and beta from the
//                           gate inputs
//   gated_delta_recurrent : the delta rule token by token on a sequence's state (decode and
//                           prefill): each thread owns one column of a head's [dk, dv] state,
//                           since the rule updates the columns independently (a block per head
//                           and 32 columns); q, k, v and the gates are staged in shared memory
//                           16 tokens at a time
//   gated_delta_chunked   : the chunked form, below; exact too, but as written 6-9x slower than
//                           the recurrence on an H200 (bench/cuda/delta_rule_bench), so the
//                           forward does not use it
//   gated_rms_norm        : x = w * rmsnorm(x) * silu(z) per head
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace turbokv::cuda {

struct GatedDeltaDims {
  int key_heads = 0;
  int value_heads = 0;  // a multiple of key_heads
  int k_dim = 0;
  int v_dim = 0;
};

// x, out: [T, C] (out may not alias x); weight [C, K]; history [K-1, C], oldest first.
void causal_conv1d_silu(const float* x, int64_t T, int C, int K, const float* weight,
                        float* history, float* out, cudaStream_t stream);

// qkv: [T, 2*Hk*dk + Hv*dv] in place; a, b: [T, Hv] in place (-> g, beta); a_log, dt_bias [Hv].
void gated_delta_prepare(float* qkv, float* a, float* b, int64_t T, const GatedDeltaDims& s,
                         const float* a_log, const float* dt_bias, cudaStream_t stream);

// As model/linear_attention.h's GatedDeltaInputs: q, k rows of stride qk_stride ([Hk, dk] at
// q, k), v rows of stride v_stride ([Hv, dv]), g, beta [T, Hv]; state [Hv, dk, dv] updated;
// out [T, Hv, dv].
struct GatedDeltaRows {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t qk_stride = 0;
  int64_t v_stride = 0;
  const float* g = nullptr;
  const float* beta = nullptr;
  int64_t T = 0;
};
void gated_delta_recurrent(const GatedDeltaRows& in, const GatedDeltaDims& s, float* state,
                           float* out, cudaStream_t stream);

// The chunked (UT-transform) form of the same rule: per chunk of kDeltaChunk tokens
// the intra-chunk part by small matrix products in shared memory (a block per value head, the
// state's columns spread over its threads), one state update per chunk; model/linear_attention.h's
// gated_delta_chunked in the same order of operations per element. k_dim and v_dim <= 256.
constexpr int kDeltaChunk = 32;
void gated_delta_chunked(const GatedDeltaRows& in, const GatedDeltaDims& s, float* state,
                         float* out, cudaStream_t stream);

// x: [rows, d] in place, z: [rows, d], w: [d].
void gated_rms_norm(float* x, const float* z, int64_t rows, int d, const float* w, float eps,
                    cudaStream_t stream);

}  // namespace turbokv::cuda
