// Scalar references for matmul.h: plain loops, double accumulation.
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/matmul.h"

namespace turbokv {
namespace {

// Element index of w, whose dtype check_weight_dtype has accepted.
float weight_at(const WeightMatrix& w, int64_t index) {
  if (w.dtype == DType::F32) return reinterpret_cast<const float*>(w.data)[index];
  const uint16_t bits = reinterpret_cast<const uint16_t*>(w.data)[index];
  return w.dtype == DType::F16 ? f16_to_f32(bits) : bf16_to_f32(bits);
}

}  // namespace

void matmul_ref(const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y) {
  check_weight_dtype(w);
  std::vector<float> row(size_t(w.cols));  // [cols] one weight row in f32
  for (int64_t n = 0; n < w.rows; ++n) {
    widen_rows_ref(w, n, 1, row.data());
    for (int64_t i = 0; i < m; ++i) {
      double sum = bias != nullptr ? bias[n] : 0.0;
      for (int64_t k = 0; k < w.cols; ++k) sum += double(x[i * w.cols + k]) * row[size_t(k)];
      y[i * w.rows + n] = float(sum);
    }
  }
}

void widen_rows_ref(const WeightMatrix& w, int64_t begin, int64_t count, float* out) {
  check_weight_dtype(w);
  if (w.format != WeightFormat::kDense) return dequantize_rows_ref(w, begin, count, out);
  for (int64_t i = 0; i < count * w.cols; ++i) out[i] = weight_at(w, begin * w.cols + i);
}

void check_gather_rows(const WeightMatrix& w, const int32_t* rows, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= w.rows) {
      throw InvalidArgument(
          str_cat("token id ", rows[i], " is outside the vocabulary [0, ", w.rows, ")"));
    }
  }
}

void gather_rows_ref(const WeightMatrix& w, const int32_t* rows, int64_t n, float scale,
                     float* out) {
  check_gather_rows(w, rows, n);
  check_weight_dtype(w);
  for (int64_t i = 0; i < n; ++i) {
    widen_rows_ref(w, rows[i], 1, out + i * w.cols);
    for (int64_t k = 0; k < w.cols; ++k) out[i * w.cols + k] *= scale;
  }
}

}  // namespace turbokv
