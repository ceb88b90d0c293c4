// Matrix products against model weights in their stored dtype: y = x · Wᵀ (+ bias), the layout
// of torch.nn.Linear ([out_features, in_features]). Weights stay memory-mapped as f32, f16 or
// bf16 and are widened to f32 on the fly; activations and accumulation are f32.
//
//   matmul      : fast path. Few rows (decode): AVX2 dot products over weight rows, threads
//                 split the output features. Many rows (prefill): weight panels widened to f32
//                 and multiplied by OpenBLAS sgemm, one panel per task of our thread pool.
//   matmul_ref  : slow, obvious scalar reference (double accumulation) the fast path is tested
//                 against.
#pragma once

#include <cstdint>
#include <span>

#include "core/safetensors.h"

namespace turbokv {

// A row-major [rows, cols] weight matrix whose elements are F32, F16 or BF16.
struct WeightMatrix {
  DType dtype = DType::F32;
  const uint8_t* data = nullptr;  // [rows, cols] elements of dtype
  int64_t rows = 0;
  int64_t cols = 0;

  // Rows [begin, begin + count) as a matrix of their own (e.g. q out of a fused qkv_proj).
  WeightMatrix row_slice(int64_t begin, int64_t count) const;
};

// y[m, w.rows] = x[m, w.cols] · wᵀ + bias ([w.rows], may be null). y may not alias x.
void matmul(const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y);
void matmul_ref(const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y);

// Throws InvalidArgument naming w's dtype unless it is F32, F16 or BF16 (every entry point
// here checks it).
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

// Converts rows [begin, begin + count) of w to f32: out [count, w.cols].
void widen_rows(const WeightMatrix& w, int64_t begin, int64_t count, float* out);
void widen_rows_ref(const WeightMatrix& w, int64_t begin, int64_t count, float* out);

}  // namespace turbokv
