// y = x · Wᵀ for a few activation rows (decode) on dense fp16 / bf16 weights, W [n, k]
// row-major (torch.nn.Linear's layout): a GEMV that streams W once from memory at close to
// its bandwidth, where a GEMM library's small-m kernels may not. fp32 accumulation, fp32
// result, x in W's element type (as Gemm::run takes it). Gemm::run calls it for m <= kGemvMaxRows.
//
// One warp per output row: each lane reads 16-B chunks of the row (8 elements), four in
// flight, multiplies them with the same chunk of every x row (read through L1) and the warp
// sums its lanes. The sum order differs from cuBLAS's (both fp32). Launched with PDL
// (launch.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/model_ops.h"

namespace turbokv::cuda {

constexpr int64_t kGemvMaxRows = 8;

// Whether gemv takes this problem: elem fp16 or bf16, 1 <= m <= kGemvMaxRows, k a multiple of 8,
// x and w 16-B aligned.
bool gemv_supported(const void* x, const void* w, Elem elem, int64_t m, int64_t k);

// y [m, n] (row stride ldy >= n) = x [m, k] · w [n, k]ᵀ (+ y when accumulate). Throws
// InvalidArgument for a problem gemv_supported rejects.
void gemv(const void* x, const void* w, Elem elem, int64_t m, int64_t n, int64_t k, float* y,
          int64_t ldy, bool accumulate, cudaStream_t stream);

// gemv of fp32 x, each element rounded to elem as it is read: the same result as cast() to elem
// followed by gemv, without the cast kernel. x 16-B aligned.
void gemv_f32_input(const float* x, const void* w, Elem elem, int64_t m, int64_t n, int64_t k,
                    float* y, int64_t ldy, bool accumulate, cudaStream_t stream);

// The gate/up product of a gated MLP and its activation in one kernel: with w [2 inter, k] (gate
// rows, then up rows), out [m, inter] in elem = act(x · w_gateᵀ + gate_bias) * (x · w_upᵀ +
// up_bias), the same values as gemv into [m, 2 inter] followed by gated_activation (biases
// optional).
void gemv_gated(const void* x, const void* w, Elem elem, int64_t m, int64_t inter, int64_t k,
                const float* gate_bias, const float* up_bias, Activation act, void* out,
                cudaStream_t stream);

}  // namespace turbokv::cuda
