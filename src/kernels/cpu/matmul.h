// Matrix products against model weights in their stored form: y = x · Wᵀ (+ bias), the layout
// of torch.nn.Linear ([out_features, in_features]). Weights stay memory-mapped as f32, f16 or
// bf16 (widened to f32 on the fly) or as quantized blocks (qweights.h: GGUF Q8_0/Q4_0/Q5_0/
// Q4_K/Q6_K, MLX affine), dequantized on the fly; accumulation is f32.
//
//   matmul      : fast path. Few rows (decode): AVX2 dot products over weight rows, threads
//                 split the output features; on quantized weights the activations are
//                 quantized to int8 per block of 32 and the products are integer dot products
//                 (qmatmul.h), unless f32 activations are asked for. Many rows (prefill): weight
//                 panels widened (dequantized) to f32 and multiplied by OpenBLAS sgemm, one
//                 panel per task of our thread pool.
//   matmul_ref  : slow, obvious scalar reference (double accumulation, f32 activations) the
//                 fast path is tested against.
#pragma once

#include <cstdint>
#include <span>

#include "core/safetensors.h"
#include "kernels/cpu/qweights.h"

namespace turbokv {

// A row-major [rows, cols] weight matrix: F32, F16 or BF16 elements (format kDense), or
// quantized rows (qweights.h) that are never expanded in memory.
struct WeightMatrix {
  WeightMatrix() = default;
  // A dense matrix.
  WeightMatrix(DType dtype_, const uint8_t* data_, int64_t rows_, int64_t cols_)
      : dtype(dtype_), data(data_), rows(rows_), cols(cols_) {}

  DType dtype = DType::F32;       // kDense: the element type; quantized: the type the values
                                  // round to when a model rounds a constant "to the weights' dtype"
  const uint8_t* data = nullptr;  // kDense: [rows, cols] elements of dtype; GGUF blocks:
                                  // [rows, cols / block_elems] blocks; kAffine: [rows,
                                  // cols * bits / 32] uint32 words of LSB-first codes
  int64_t rows = 0;
  int64_t cols = 0;
  WeightFormat format = WeightFormat::kDense;
  AffineParams affine;  // kAffine only

  // Bytes of one row in data (dense elements, blocks or code words).
  int64_t row_bytes() const;
  // Bytes read by one pass over the whole matrix (data, plus affine scales and biases).
  int64_t total_bytes() const;
  // Rows [begin, begin + count) as a matrix of their own (e.g. q out of a fused qkv_proj).
  WeightMatrix row_slice(int64_t begin, int64_t count) const;
};

// y[m, w.rows] = x[m, w.cols] · wᵀ + bias ([w.rows], may be null). y may not alias x.
void matmul(const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y);
void matmul_ref(const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y);

// Throws InvalidArgument naming w's dtype unless it is F32, F16 or BF16 (dense), or naming the
// quantized format and the shape when cols do not split into its blocks or groups (every
// entry point here checks it).
void check_weight_dtype(const WeightMatrix& w);

// One product of a matmul_many: y = x · wᵀ + bias, as in matmul.
struct MatmulJob {
  const float* x;  // [m, w.cols]
  WeightMatrix w;
  const float* bias;  // [w.rows] or null
  float* y;           // [m, w.rows]
};
// Several products with the same number of activation rows in one parallel region (q, k and v
// of a layer; gate and up): the threads split the output features of all of them together,
// which saves a fork/join per product when decoding.
void matmul_many(int64_t m, std::span<const MatmulJob> jobs);

// out[i, :] = scale * w[rows[i], :] for i in [0, n): an embedding lookup. Throws
// InvalidArgument naming the id when a row is outside [0, w.rows) (check_gather_rows).
void check_gather_rows(const WeightMatrix& w, const int32_t* rows, int64_t n);
void gather_rows(const WeightMatrix& w, const int32_t* rows, int64_t n, float scale, float* out);
void gather_rows_ref(const WeightMatrix& w, const int32_t* rows, int64_t n, float scale,
                     float* out);

// Converts (dequantizes) rows [begin, begin + count) of w to f32: out [count, w.cols].
void widen_rows(const WeightMatrix& w, int64_t begin, int64_t count, float* out);
void widen_rows_ref(const WeightMatrix& w, int64_t begin, int64_t count, float* out);

}  // namespace turbokv
