// What crosses from the host side of the quantized matmul (qmatmul.cc: validation, cuBLAS)
// to its kernels (gemv_*.cu, dequant.cu): plain argument structs and one launcher per kernel
// family. The host has validated every argument before a launcher runs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace turbokv::cuda {
enum class Int8GemvShape : int;  // qmatmul.h
}  // namespace turbokv::cuda

namespace turbokv::cuda::qmm {

// The kernels' formats: WeightFormat with MLX affine split by bits.
enum class Kind : uint8_t { kQ8_0, kQ4_0, kQ5_0, kQ4_K, kQ6_K, kAffine2, kAffine4, kAffine8 };

struct WeightArgs {
  const uint8_t* data = nullptr;    // [rows, row_bytes]
  const uint8_t* scales = nullptr;  // affine: [rows, groups] f16 or bf16
  const uint8_t* biases = nullptr;  // affine: [rows, groups]
  int64_t rows = 0, cols = 0, row_bytes = 0;
  int64_t groups = 0;       // affine: cols / group_size
  int group_shift = 0;      // affine: log2(group_size / 32)
  bool scales_bf16 = true;  // affine: bf16 (else f16) scales and biases
};

struct GemvArgs {
  WeightArgs w;
  const float* x = nullptr;  // [m, cols], 16-byte aligned
  int m = 0;                 // 1 .. kGemvMaxRows
  float* y = nullptr;        // [m, ldy]
  int64_t ldy = 0;
  int chunk = 0;  // columns of x staged in shared memory per pass (gemv_chunk)
};

constexpr int kGemvMaxRows = 8;
// Floats of x one GEMV pass stages at most (M rows x chunk columns): ~65 KB of shared memory
// with the padding and the sums, three blocks per SM.
constexpr int kGemvStagedFloats = 14336;

// Columns of x one GEMV pass stages for m activation rows (the kernel rounds m up to M = 1,
// 2, 4 or 8): all of cols when M * cols <= kGemvStagedFloats, else the largest multiple of
// 256 that fits.
int gemv_chunk(int64_t cols, int m);

// y = x · dequant(w)ᵀ for args.m <= kGemvMaxRows (gemv_gguf.cu, gemv_affine.cu).
void launch_gemv(Kind kind, const GemvArgs& args, cudaStream_t stream);
void launch_gemv_gguf(Kind kind, const GemvArgs& args, cudaStream_t stream);
void launch_gemv_affine(Kind kind, const GemvArgs& args, cudaStream_t stream);

// MLX 4-bit, m = 1, on int8 activations (gemv_int8.cu): workspace (16-byte aligned) of
// gemv_int8_workspace_bytes(cols) holds the quantized x; y [rows].
// shape: the kernel variant (qmatmul.h).
int64_t gemv_int8_workspace_bytes(int64_t cols);
void launch_gemv_affine4_int8(const WeightArgs& w, const float* x, float* y, uint8_t* workspace,
                              Int8GemvShape shape, cudaStream_t stream);

// out [rows, cols] = rows [row_begin, row_begin + rows) of w as bf16 (dequant.cu).
void launch_dequant(Kind kind, const WeightArgs& w, int64_t row_begin, int64_t rows,
                    __nv_bfloat16* out, cudaStream_t stream);
// out [n, cols] fp32 = scale * rows ids[0..n) of w; rows of ids outside [0, rows) are NaN
// (dequant.cu).
void launch_gather(Kind kind, const WeightArgs& w, const int32_t* ids, int64_t n, float scale,
                   float* out, cudaStream_t stream);
// out[i] = bf16(x[i]), round to nearest even (dequant.cu).
void launch_to_bf16(const float* x, int64_t n, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace turbokv::cuda::qmm
