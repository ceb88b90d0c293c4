// Host side of the quantized matmul (qmatmul.h): uploads, argument checks, the choice between
// the GEMV kernels and the dequantize + cuBLAS path, and the panel loop of the latter.
#include "kernels/cuda/qmatmul.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/qmatmul/params.h"

namespace turbokv::cuda {

static_assert(kQuantGemvMaxRows == qmm::kGemvMaxRows);

namespace {

// The view as a host WeightMatrix (device pointers, never dereferenced on the host), so the
// CPU side's shape and parameter checks apply unchanged.
WeightMatrix as_weight_matrix(const QuantWeightsView& w) {
  WeightMatrix m{DType::BF16, w.data, w.rows, w.cols};
  m.format = w.format;
  m.affine = AffineParams{w.scales, w.biases, w.scale_dtype, w.bits, w.group_size};
  return m;
}

qmm::Kind kind_of(const QuantWeightsView& w) {
  switch (w.format) {
    case WeightFormat::kQ8_0:
      return qmm::Kind::kQ8_0;
    case WeightFormat::kQ4_0:
      return qmm::Kind::kQ4_0;
    case WeightFormat::kQ5_0:
      return qmm::Kind::kQ5_0;
    case WeightFormat::kQ4_K:
      return qmm::Kind::kQ4_K;
    case WeightFormat::kQ6_K:
      return qmm::Kind::kQ6_K;
    case WeightFormat::kAffine:
      return w.bits == 2 ? qmm::Kind::kAffine2
                         : (w.bits == 4 ? qmm::Kind::kAffine4 : qmm::Kind::kAffine8);
    case WeightFormat::kDense:
      break;
  }
  throw InvalidArgument("quantized matmul: the weights are dense (use the bf16/fp16/fp32 GEMM)");
}

bool aligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Shape, parameters and pointer alignment of w (qmatmul.h); returns the kernels' kind.
qmm::Kind check_view(const QuantWeightsView& w, const char* what) {
  check_weight_dtype(as_weight_matrix(w));
  const qmm::Kind kind = kind_of(w);
  if (w.rows < 0 || w.cols < 1) {
    throw InvalidArgument(str_cat(what, ": weight shape [", w.rows, ", ", w.cols, "]"));
  }
  const uintptr_t need =
      kind == qmm::Kind::kQ4_K || kind == qmm::Kind::kAffine4 || kind == qmm::Kind::kAffine8
          ? 16
          : (kind == qmm::Kind::kAffine2 ? 8 : 2);
  if (w.data == nullptr || !aligned(w.data, need)) {
    throw InvalidArgument(str_cat(what, ": ", weight_format_name(w.format),
                                  " weight data must be a ", need, "-byte aligned device pointer"));
  }
  if (w.format == WeightFormat::kAffine && (w.scales == nullptr || w.biases == nullptr ||
                                            !aligned(w.scales, 2) || !aligned(w.biases, 2))) {
    throw InvalidArgument(str_cat(what,
                                  ": MLX affine scales and biases must be 2-byte aligned "
                                  "device pointers"));
  }
  return kind;
}

qmm::WeightArgs weight_args(const QuantWeightsView& w) {
  qmm::WeightArgs a;
  a.data = w.data;
  a.scales = w.scales;
  a.biases = w.biases;
  a.rows = w.rows;
  a.cols = w.cols;
  a.row_bytes = w.row_bytes();
  if (w.format == WeightFormat::kAffine) {
    a.groups = w.cols / w.group_size;
    a.group_shift = w.group_size == 32 ? 0 : (w.group_size == 64 ? 1 : 2);
    a.scales_bf16 = w.scale_dtype == DType::BF16;
  }
  return a;
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(str_cat("cuBLAS ", what, " failed: ", cublasGetStatusString(status)));
  }
}

void upload_bytes(DeviceBuffer<uint8_t>& dst, size_t at, const uint8_t* src, size_t bytes) {
  if (bytes > 0) {
    TURBOKV_CUDA_CHECK(cudaMemcpy(dst.data() + at, src, bytes, cudaMemcpyHostToDevice));
  }
}

}  // namespace

int64_t QuantWeightsView::row_bytes() const {
  return as_weight_matrix(*this).row_bytes();
}

QuantWeightsView QuantWeightsView::row_slice(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin + count > rows) {
    throw InvalidArgument(
        str_cat("row_slice(", begin, ", ", count, ") of a matrix with ", rows, " rows"));
  }
  const WeightMatrix slice = as_weight_matrix(*this).row_slice(begin, count);
  QuantWeightsView v = *this;
  v.data = slice.data;
  v.scales = slice.affine.scales;
  v.biases = slice.affine.biases;
  v.rows = count;
  return v;
}

bool same_quant_layout(const WeightMatrix& a, const WeightMatrix& b) {
  if (a.format != b.format || a.cols != b.cols) return false;
  if (a.format != WeightFormat::kAffine) return true;
  return a.affine.bits == b.affine.bits && a.affine.group_size == b.affine.group_size &&
         a.affine.scale_dtype == b.affine.scale_dtype;
}

DeviceQuantMatrix upload_quant_matrix(const WeightMatrix& w) {
  return upload_quant_rows({&w});
}

DeviceQuantMatrix upload_quant_rows(std::initializer_list<const WeightMatrix*> parts) {
  if (parts.size() == 0) throw InvalidArgument("upload_quant_rows: no matrices");
  const WeightMatrix& first = **parts.begin();
  int64_t rows = 0;
  for (const WeightMatrix* p : parts) {
    if (p->format == WeightFormat::kDense) {
      throw InvalidArgument(str_cat("upload_quant_rows: the ", dtype_name(p->dtype), " [", p->rows,
                                    ", ", p->cols, "] matrix is dense, not quantized"));
    }
    check_weight_dtype(*p);
    if (!same_quant_layout(first, *p)) {
      throw InvalidArgument(str_cat("upload_quant_rows: a ", weight_format_name(p->format), " [",
                                    p->rows, ", ", p->cols, "] part does not match the first ",
                                    weight_format_name(first.format), " [", first.rows, ", ",
                                    first.cols, "] one (format, cols, bits, group size)"));
    }
    rows += p->rows;
  }
  DeviceQuantMatrix d;
  QuantWeightsView& v = d.view;
  v.format = first.format;
  v.rows = rows;
  v.cols = first.cols;
  const size_t row_bytes = size_t(first.row_bytes());
  d.data = DeviceBuffer<uint8_t>(size_t(rows) * row_bytes + kQuantPadBytes);
  size_t at = 0;
  for (const WeightMatrix* p : parts) {
    upload_bytes(d.data, at, p->data, size_t(p->rows) * row_bytes);
    at += size_t(p->rows) * row_bytes;
  }
  TURBOKV_CUDA_CHECK(cudaMemset(d.data.data() + at, 0, kQuantPadBytes));
  v.data = d.data.data();
  if (first.format == WeightFormat::kAffine) {
    const size_t group_bytes = size_t(first.cols / first.affine.group_size) * 2;  // per row
    d.scales = DeviceBuffer<uint8_t>(size_t(rows) * group_bytes);
    d.biases = DeviceBuffer<uint8_t>(size_t(rows) * group_bytes);
    at = 0;
    for (const WeightMatrix* p : parts) {
      upload_bytes(d.scales, at, p->affine.scales, size_t(p->rows) * group_bytes);
      upload_bytes(d.biases, at, p->affine.biases, size_t(p->rows) * group_bytes);
      at += size_t(p->rows) * group_bytes;
    }
    v.scales = d.scales.data();
    v.biases = d.biases.data();
    v.scale_dtype = first.affine.scale_dtype;
    v.bits = first.affine.bits;
    v.group_size = first.affine.group_size;
  }
  // Pageable copies and the memset may still run on the legacy stream: finish them here.
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return d;
}

QuantScratch::QuantScratch(int64_t max_m, int64_t max_cols, int64_t panel_elems) {
  if (max_m < 1 || max_cols < 1 || panel_elems < max_cols) {
    throw InvalidArgument(str_cat("QuantScratch: max_m ", max_m, ", max_cols ", max_cols,
                                  ", panel_elems ", panel_elems,
                                  " (need max_m, max_cols >= 1 and panel_elems >= max_cols)"));
  }
  max_m_ = max_m;
  max_cols_ = max_cols;
  x_ = DeviceBuffer<__nv_bfloat16>(size_t(max_m * max_cols));
  panel_ = DeviceBuffer<__nv_bfloat16>(size_t(panel_elems));
}

void quant_matmul(const QuantWeightsView& w, const float* x, int64_t m, float* y, int64_t ldy,
                  QuantScratch& scratch, cublasHandle_t blas, cudaStream_t stream) {
  const qmm::Kind kind = check_view(w, "quant_matmul");
  if (m < 0 || ldy < w.rows) {
    throw InvalidArgument(str_cat("quant_matmul: m ", m, ", ldy ", ldy, " for ", w.rows,
                                  " output features (need m >= 0, ldy >= ", w.rows, ")"));
  }
  if (m == 0 || w.rows == 0) return;
  if (x == nullptr || y == nullptr || !aligned(x, 16)) {
    throw InvalidArgument("quant_matmul: x must be a 16-byte aligned device pointer, y non-null");
  }
  const qmm::WeightArgs wa = weight_args(w);
  if (m == 1 && gpu_int8_activations_enabled() && quant_gemv_int8_supported(w) &&
      scratch.max_m() >= 1 &&
      2 * scratch.max_m() * scratch.max_cols() >= quant_gemv_int8_workspace_bytes(w.cols)) {
    qmm::launch_gemv_affine4_int8(wa, x, y, reinterpret_cast<uint8_t*>(scratch.x_bf16()),
                                  int8_gemv_shape(), stream);
    return;
  }
  if (m <= kQuantGemvMaxRows || f32_reference_mode()) {
    // The reference mode takes the fp32 GEMV for any m.
    return quant_matmul_gemv(w, x, m, y, ldy, stream);
  }
  if (m > scratch.max_m() || w.cols > scratch.max_cols() || w.cols > scratch.panel_elems()) {
    throw InvalidArgument(str_cat("quant_matmul: m ", m, " x cols ", w.cols,
                                  " does not fit the scratch (max_m ", scratch.max_m(),
                                  ", max_cols ", scratch.max_cols(), ", panel_elems ",
                                  scratch.panel_elems(), ")"));
  }
  if (m > INT32_MAX || w.rows > INT32_MAX || w.cols > INT32_MAX || ldy > INT32_MAX) {
    throw InvalidArgument(str_cat("quant_matmul: m ", m, ", rows ", w.rows, ", cols ", w.cols,
                                  ", ldy ", ldy, " exceed cuBLAS's int range"));
  }
  if (blas == nullptr) {
    throw InvalidArgument(
        str_cat("quant_matmul: m ", m, " > ", kQuantGemvMaxRows, " needs a cuBLAS handle"));
  }
  cudaStream_t blas_stream = nullptr;
  check_cublas(cublasGetStream(blas, &blas_stream), "cublasGetStream");
  if (blas_stream != stream) {
    throw InvalidArgument("quant_matmul: the cuBLAS handle is bound to another stream");
  }
  qmm::launch_to_bf16(x, m * w.cols, scratch.x_bf16(), stream);
  const int64_t panel_rows = std::min(w.rows, scratch.panel_elems() / w.cols);
  const float one = 1.0f, zero = 0.0f;
  for (int64_t r0 = 0; r0 < w.rows; r0 += panel_rows) {
    const int64_t n = std::min(panel_rows, w.rows - r0);
    qmm::launch_dequant(kind, wa, r0, n, scratch.panel(), stream);
    // Column-major view: yᵀ [n, m] (ld ldy) = panel [n, cols] (stored as its transpose,
    // ld cols) · xᵀ [cols, m] (ld cols).
    check_cublas(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(w.cols), &one,
                              scratch.panel(), CUDA_R_16BF, int(w.cols), scratch.x_bf16(),
                              CUDA_R_16BF, int(w.cols), &zero, y + r0, CUDA_R_32F, int(ldy),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }
}

void quant_matmul_gemv(const QuantWeightsView& w, const float* x, int64_t m, float* y,
                       int64_t ldy, cudaStream_t stream) {
  const qmm::Kind kind = check_view(w, "quant_matmul_gemv");
  if (m < 0 || ldy < w.rows) {
    throw InvalidArgument(str_cat("quant_matmul_gemv: m ", m, ", ldy ", ldy, " for ", w.rows,
                                  " output features (need m >= 0, ldy >= ", w.rows, ")"));
  }
  if (m == 0 || w.rows == 0) return;
  if (x == nullptr || y == nullptr || !aligned(x, 16)) {
    throw InvalidArgument(
        "quant_matmul_gemv: x must be a 16-byte aligned device pointer, y non-null");
  }
  const qmm::WeightArgs wa = weight_args(w);
  for (int64_t i0 = 0; i0 < m; i0 += kQuantGemvMaxRows) {
    qmm::GemvArgs a;
    a.w = wa;
    a.x = x + i0 * w.cols;  // 16-byte aligned: cols is a multiple of 32
    a.m = int(std::min(kQuantGemvMaxRows, m - i0));
    a.y = y + i0 * ldy;
    a.ldy = ldy;
    a.chunk = qmm::gemv_chunk(w.cols, a.m);
    qmm::launch_gemv(kind, a, stream);
  }
}

size_t upload_dense_parts(std::initializer_list<const WeightMatrix*> parts, bool widen,
                          uint8_t* dst) {
  size_t offset = 0;
  std::vector<float> wide;
  for (const WeightMatrix* p : parts) {
    if (p->rows == 0) continue;
    const void* src = p->data;
    size_t bytes = size_t(p->rows) * size_t(p->cols) * dtype_size(p->dtype);
    if (widen && p->dtype != DType::F32) {
      wide.resize(size_t(p->rows) * size_t(p->cols));
      dequantize_rows_ref(*p, 0, p->rows, wide.data());
      src = wide.data();
      bytes = wide.size() * sizeof(float);
    }
    TURBOKV_CUDA_CHECK(cudaMemcpy(dst + offset, src, bytes, cudaMemcpyHostToDevice));
    offset += bytes;
  }
  return offset;
}

bool gpu_int8_activations_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TURBOKV_GPU_INT8_ACTIVATIONS");
    return (v == nullptr || std::strcmp(v, "0") != 0) && !f32_reference_mode();
  }();
  return enabled;
}

const char* int8_gemv_shape_name(Int8GemvShape shape) {
  switch (shape) {
    case Int8GemvShape::kUnits4: return "units4";
    case Int8GemvShape::kUnits2Blocks3: return "units2_blocks3";
  }
  return "?";
}

Int8GemvShape int8_gemv_shape() {
  static const Int8GemvShape shape = [] {
    const char* v = std::getenv("TURBOKV_GPU_INT8_GEMV_SHAPE");
    if (v == nullptr || v[0] == '\0') return Int8GemvShape::kUnits4;
    if (v[1] != '\0' || v[0] < '0' || v[0] >= char('0' + kInt8GemvShapes)) {
      throw InvalidArgument(str_cat("TURBOKV_GPU_INT8_GEMV_SHAPE=", v, ": expected 0 to ",
                                    kInt8GemvShapes - 1));
    }
    return Int8GemvShape(v[0] - '0');
  }();
  return shape;
}

bool quant_gemv_int8_supported(const QuantWeightsView& w) {
  return w.format == WeightFormat::kAffine && w.bits == 4 && w.group_size >= 32 &&
         w.cols % 32 == 0;
}

int64_t quant_gemv_int8_workspace_bytes(int64_t cols) {
  return qmm::gemv_int8_workspace_bytes(cols);
}

void quant_gemv_int8(const QuantWeightsView& w, const float* x, float* y, void* workspace,
                     cudaStream_t stream, Int8GemvShape shape) {
  check_view(w, "quant_gemv_int8");
  if (int(shape) < 0 || int(shape) >= kInt8GemvShapes) {
    throw InvalidArgument(str_cat("quant_gemv_int8: kernel shape ", int(shape), " (0 to ",
                                  kInt8GemvShapes - 1, ")"));
  }
  if (!quant_gemv_int8_supported(w)) {
    throw InvalidArgument(str_cat("quant_gemv_int8: ", weight_format_name(w.format), " with ",
                                  w.bits, " bits: only MLX 4-bit weights have an int8 GEMV"));
  }
  if (w.rows == 0) return;
  if (x == nullptr || y == nullptr || workspace == nullptr || !aligned(x, 16) ||
      !aligned(workspace, 16)) {
    throw InvalidArgument("quant_gemv_int8: x and workspace must be 16-byte aligned device "
                          "pointers, y non-null");
  }
  qmm::launch_gemv_affine4_int8(weight_args(w), x, y, static_cast<uint8_t*>(workspace), shape,
                                stream);
}

void dequantize_to_bf16(const QuantWeightsView& w, int64_t row_begin, int64_t rows,
                        __nv_bfloat16* out, cudaStream_t stream) {
  const qmm::Kind kind = check_view(w, "dequantize_to_bf16");
  if (row_begin < 0 || rows < 0 || row_begin + rows > w.rows) {
    throw InvalidArgument(str_cat("dequantize_to_bf16: rows [", row_begin, ", ", row_begin + rows,
                                  ") of a matrix with ", w.rows, " rows"));
  }
  if (rows == 0) return;
  if (out == nullptr || !aligned(out, 16)) {
    throw InvalidArgument("dequantize_to_bf16: out must be a 16-byte aligned device pointer");
  }
  qmm::launch_dequant(kind, weight_args(w), row_begin, rows, out, stream);
}

void quant_gather_rows(const QuantWeightsView& w, const int32_t* ids, int64_t n, float scale,
                       float* out, cudaStream_t stream) {
  const qmm::Kind kind = check_view(w, "quant_gather_rows");
  if (n < 0) throw InvalidArgument(str_cat("quant_gather_rows: n ", n));
  if (n == 0) return;
  if (ids == nullptr || out == nullptr || !aligned(out, 16)) {
    throw InvalidArgument("quant_gather_rows: ids and a 16-byte aligned out device pointer needed");
  }
  qmm::launch_gather(kind, weight_args(w), ids, n, scale, out, stream);
}

namespace qmm {

int gemv_chunk(int64_t cols, int m) {
  const int rows = m == 1 ? 1 : (m == 2 ? 2 : (m <= 4 ? 4 : 8));  // the kernel's M
  const int max_chunk = kGemvStagedFloats / rows / 256 * 256;
  return int(std::min<int64_t>(cols, max_chunk));
}

void launch_gemv(Kind kind, const GemvArgs& args, cudaStream_t stream) {
  if (kind == Kind::kAffine2 || kind == Kind::kAffine4 || kind == Kind::kAffine8) {
    return launch_gemv_affine(kind, args, stream);
  }
  launch_gemv_gguf(kind, args, stream);
}

}  // namespace qmm
}  // namespace turbokv::cuda
