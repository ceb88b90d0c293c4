// Attention over a contiguous cache of latent rows (MLA layers whose rows are wider than the
// paged formats' 256 dims): rows [len, dim] of elem, shared by every head as both key and
// value. Queries [n_q, heads, dim] fp32 at the last n_q positions (query i sees rows
// < len - n_q + i + 1); out [n_q, heads, dim] = softmax(scale * q · rowsᵀ) · rows. fp32
// arithmetic (scores, a max-shifted softmax summed in float, the weighted sum). Device pointers,
// queued on `stream`; workspace: latent_attention_workspace_floats(n_q, heads, len) floats.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/model_ops.h"

namespace turbokv::cuda {

int64_t latent_attention_workspace_floats(int n_q, int heads, int64_t len);

// The same over separate keys and values [len, kv_heads, dim] (dense attention layers whose
// heads are wider than the paged formats take): query head h reads KV head h / (heads /
// kv_heads); window > 0: a query at p sees keys in (p - window, p].
void contiguous_attention(const void* k, const void* v, Elem elem, int64_t len, int kv_heads,
                          int dim, const float* q, int n_q, int heads, float scale, int window,
                          float* workspace, float* out, cudaStream_t stream);

void latent_attention(const void* rows, Elem elem, int64_t len, int dim, const float* q, int n_q,
                      int heads, float scale, float* workspace, float* out, cudaStream_t stream);

}  // namespace turbokv::cuda
