// Row and elementwise kernels of the layer kinds beyond plain attention (model/cuda/
// hybrid_forward.h): strided column copies, the attention output gate, scaling, and the pair
// order of interleaved rotary dims. Device pointers, fp32, queued on `stream`; each mirrors a
// few lines of the CPU forward (model/decoder.cc, model/mla.cc) that the tests compare.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace turbokv::cuda {

// dst[r * dst_ld + c] = src[r * src_ld + c] for r < rows, c < cols.
void copy_cols(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
               int64_t cols, cudaStream_t stream);

// qg [T, heads, 2 hd] (query, then output gate, per head) -> q rows of stride q_ld ([heads, hd]
// at q + t * q_ld) and gate [T, heads * hd].
void split_query_gate(const float* qg, int64_t T, int heads, int hd, float* q, int64_t q_ld,
                      float* gate, cudaStream_t stream);

// x[i] *= sigmoid(gate[i]) for i < n.
void sigmoid_gate(float* x, const float* gate, int64_t n, cudaStream_t stream);

// out[r, :] += sigmoid(gate[r]) * y[r, :] for r < rows (a gated shared expert).
void add_sigmoid_gated_rows(float* out, const float* y, const float* gate, int64_t rows,
                            int64_t dim, cudaStream_t stream);

// x[i] *= s.
void scale(float* x, int64_t n, float s, cudaStream_t stream);

// x[i] = (x[i] + y[i]) * s.
void add_scale(float* x, const float* y, int64_t n, float s, cudaStream_t stream);

// Rows of d dims (row stride ld) from adjacent rotary pairs (x0, x1, x2, ...) to the
// rotate-half order (x0, x2, ..., x1, x3, ...), in place (model/mla.h deinterleave_pairs).
void deinterleave_pairs(float* x, int64_t rows, int64_t ld, int d, cudaStream_t stream);

}  // namespace turbokv::cuda
