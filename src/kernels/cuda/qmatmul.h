// Matrix products on quantized weights in GPU memory: y = x · dequant(W)ᵀ with W in one of the
// formats of kernels/cpu/qweights.h (GGUF Q8_0/Q4_0/Q5_0/Q4_K/Q6_K, MLX affine 2/4/8 bits),
// uploaded byte for byte as the checkpoint stores it. x and y are fp32.
//
//   quant_matmul, m <= kQuantGemvMaxRows (decode): one pass over the quantized rows. Blocks of
//       8 warps stage the activation rows in shared memory; each warp owns 2 weight rows and
//       its lanes stream the rows' blocks with 16-byte loads, unpack them with integer ops
//       and accumulate all m activation rows in fp32, so the weights are read once.
//   quant_matmul, m > kQuantGemvMaxRows (prefill): panels of rows dequantized to bf16 in
//       QuantScratch, x narrowed to bf16, and cuBLAS (bf16 x bf16, fp32 accumulation); in the
//       fp32 reference mode (TURBOKV_F32_ACTIVATIONS=1, f32_reference_mode) the GEMV
//       instead, kQuantGemvMaxRows rows of x per pass, so no activation is rounded.
//   dequantize_to_bf16: the weights as bf16, equal bit for bit to rounding
//       dequantize_rows_ref's fp32 values.
//   quant_gather_rows: rows picked by token id, in fp32 (embedding lookups).
// All pointers are device pointers; work is queued on `stream` (the cuBLAS handle must be
// bound to the same stream).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/cpu/qweights.h"
#include "kernels/cuda/device_buffer.h"

namespace turbokv::cuda {

// Products with at most this many activation rows run the GEMV kernels (no cuBLAS).
constexpr int64_t kQuantGemvMaxRows = 8;

// Readable bytes the kernels need after the last row of a matrix (see QuantWeightsView).
constexpr int64_t kQuantPadBytes = 64;

// Quantized weights in device memory (not owning), laid out exactly as WeightMatrix's data:
// row n at data + n * row_bytes(). The kernels read 16-byte aligned spans around each block,
// so data must be 2-byte aligned (Q4_K and MLX 4/8-bit: 16-byte, MLX 2-bit: 8-byte) inside
// an allocation that starts 16-byte aligned and extends at least kQuantPadBytes past the
// last row; upload_quant_matrix's buffers do.
struct QuantWeightsView {
  WeightFormat format = WeightFormat::kQ8_0;  // any but kDense
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;    // [rows, row_bytes()] blocks or uint32 code words
  const uint8_t* scales = nullptr;  // kAffine: [rows, cols / group_size] of scale_dtype
  const uint8_t* biases = nullptr;  // kAffine: [rows, cols / group_size] of scale_dtype
  DType scale_dtype = DType::BF16;  // kAffine: F16 or BF16
  int bits = 0;                     // kAffine: 2, 4 or 8
  int group_size = 0;               // kAffine: 32, 64 or 128

  int64_t row_bytes() const;
  // Rows [begin, begin + count) (e.g. q out of a fused qkv_proj).
  QuantWeightsView row_slice(int64_t begin, int64_t count) const;
};

// A quantized WeightMatrix copied to the device (data, and the affine scales and biases),
// owning its buffers; `view` points into them and stays valid when the object moves.
struct DeviceQuantMatrix {
  QuantWeightsView view;
  DeviceBuffer<uint8_t> data;    // [rows * row_bytes + kQuantPadBytes], the padding zeroed
  DeviceBuffer<uint8_t> scales;  // kAffine only
  DeviceBuffer<uint8_t> biases;  // kAffine only
};

// Copies w's bytes to the device (complete when it returns). Throws InvalidArgument for a
// dense matrix and for shapes, bits or group sizes check_weight_dtype rejects.
DeviceQuantMatrix upload_quant_matrix(const WeightMatrix& w);
// The row-wise concatenation of parts as one matrix (q, k and v of a layer, or gate and up,
// for one fused product): they must share format, cols and the MLX bits, group size and
// scale dtype (same_quant_layout), else InvalidArgument names the first part that differs.
DeviceQuantMatrix upload_quant_rows(std::initializer_list<const WeightMatrix*> parts);
bool same_quant_layout(const WeightMatrix& a, const WeightMatrix& b);

// Device memory of the prefill path: x narrowed to bf16 and one panel of dequantized rows.
// A default-constructed scratch holds nothing and serves products with m <= kQuantGemvMaxRows.
class QuantScratch {
 public:
  static constexpr int64_t kDefaultPanelElems = int64_t(1) << 26;  // 128 MiB of bf16

  QuantScratch() = default;
  // Room for x [max_m, max_cols] and panels of up to panel_elems weights (>= the widest
  // matrix's cols; a matrix is dequantized floor(panel_elems / cols) rows at a time).
  QuantScratch(int64_t max_m, int64_t max_cols, int64_t panel_elems = kDefaultPanelElems);

  int64_t max_m() const { return max_m_; }
  int64_t max_cols() const { return max_cols_; }
  int64_t panel_elems() const { return int64_t(panel_.size()); }
  __nv_bfloat16* x_bf16() { return x_.data(); }
  __nv_bfloat16* panel() { return panel_.data(); }

 private:
  int64_t max_m_ = 0, max_cols_ = 0;
  DeviceBuffer<__nv_bfloat16> x_;      // [max_m, max_cols]
  DeviceBuffer<__nv_bfloat16> panel_;  // [panel_elems]
};

// y [m, w.rows] (row stride ldy >= w.rows) = x [m, w.cols] · dequant(w)ᵀ, fp32 accumulation.
// x must be 16-byte aligned and may not alias y. m > kQuantGemvMaxRows needs a scratch sized
// for (m, w.cols) and a cuBLAS handle bound to `stream` (pointer mode host); smaller m use
// neither (blas may be null). Throws InvalidArgument naming the bad argument.
void quant_matmul(const QuantWeightsView& w, const float* x, int64_t m, float* y, int64_t ldy,
                  QuantScratch& scratch, cublasHandle_t blas, cudaStream_t stream);
inline void quant_matmul(const DeviceQuantMatrix& w, const float* x, int64_t m, float* y,
                         int64_t ldy, QuantScratch& scratch, cublasHandle_t blas,
                         cudaStream_t stream) {
  quant_matmul(w.view, x, m, y, ldy, scratch, blas, stream);
}

// The int8-activation decode GEMV (quant_matmul uses it for m = 1 on MLX 4-bit weights when
// the scratch has room and gpu_int8_activations_enabled(): not with
// TURBOKV_GPU_INT8_ACTIVATIONS=0 or in the reference mode below):
// x is quantized per block of 32 as the CPU's quantize_activations does (d = max|x| / 127,
// q = rint(x / d)) and the codes meet it in dp4a integer dot products, ~1 issue slot per
// weight instead of ~3.5. y [w.rows] = the product, as qmatmul_rows_ref of those blocks up to
// fp32 rounding. workspace: quant_gemv_int8_workspace_bytes(w.cols) bytes, 16-byte aligned.
// The kernel comes in shapes that trade registers for warps in flight (units of 32 values per
// pass, the blocks per SM it is compiled for); all give the same sums. quant_matmul takes
// kUnits4 unless TURBOKV_GPU_INT8_GEMV_SHAPE names another (0-1, in the order below:
// a benchmarking switch; bench/cuda/qmatmul_bench times every shape).
enum class Int8GemvShape : int { kUnits4, kUnits2Blocks3 };
constexpr int kInt8GemvShapes = 2;
const char* int8_gemv_shape_name(Int8GemvShape shape);
Int8GemvShape int8_gemv_shape();  // the shape quant_matmul uses
bool gpu_int8_activations_enabled();
// In the reference mode (f32_reference_mode(), kernels/cpu/qweights.h) every quant_matmul runs
// the fp32 GEMV (quant_matmul_gemv), whatever m, and the int8 GEMV is not used.
// Copies rows of the dense parts (one dtype, same cols) one after another to dst: as stored,
// or widened to fp32 when widen (the reference mode's dense weights, so that every product
// takes fp32 activations too). Returns the bytes written.
size_t upload_dense_parts(std::initializer_list<const WeightMatrix*> parts, bool widen,
                          uint8_t* dst);
// The fp32 GEMV for any m (kQuantGemvMaxRows rows of x per pass, the weights read once per
// pass): y [m, w.rows] (row stride ldy) as quant_matmul's m <= kQuantGemvMaxRows path.
void quant_matmul_gemv(const QuantWeightsView& w, const float* x, int64_t m, float* y,
                       int64_t ldy, cudaStream_t stream);
bool quant_gemv_int8_supported(const QuantWeightsView& w);
int64_t quant_gemv_int8_workspace_bytes(int64_t cols);
void quant_gemv_int8(const QuantWeightsView& w, const float* x, float* y, void* workspace,
                     cudaStream_t stream, Int8GemvShape shape = int8_gemv_shape());

// out [n, w.cols] fp32 = scale * dequant(w)[ids[i], :] for i < n, an embedding lookup equal to
// gather_rows_ref. ids [n] on the device, checked by the caller (check_gather_rows): the row
// of an id outside [0, w.rows) comes out NaN. out 16-byte aligned.
void quant_gather_rows(const QuantWeightsView& w, const int32_t* ids, int64_t n, float scale,
                       float* out, cudaStream_t stream);
inline void quant_gather_rows(const DeviceQuantMatrix& w, const int32_t* ids, int64_t n,
                              float scale, float* out, cudaStream_t stream) {
  quant_gather_rows(w.view, ids, n, scale, out, stream);
}

// out [rows, w.cols] = rows [row_begin, row_begin + rows) of w as bf16 (out 16-byte aligned).
void dequantize_to_bf16(const QuantWeightsView& w, int64_t row_begin, int64_t rows,
                        __nv_bfloat16* out, cudaStream_t stream);
inline void dequantize_to_bf16(const DeviceQuantMatrix& w, int64_t row_begin, int64_t rows,
                               __nv_bfloat16* out, cudaStream_t stream) {
  dequantize_to_bf16(w.view, row_begin, rows, out, stream);
}

}  // namespace turbokv::cuda
