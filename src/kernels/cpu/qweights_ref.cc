// Scalar references for the quantized formats (qweights.h): dequantization written from the
// block layouts, int8 activation quantization and the integer-path reference product.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/cpu.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/matmul.h"

namespace turbokv {
namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float half(const uint8_t* p) {
  return f16_to_f32(load_u16(p));
}

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = half(b);
  for (int j = 0; j < 32; ++j) y[j] = d * float(int8_t(b[2 + j]));
}

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = half(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float((b[2 + j] & 0xF) - 8);
    y[j + 16] = d * float((b[2 + j] >> 4) - 8);
  }
}

void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = half(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | int(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * float(lo - 16);
    y[j + 16] = d * float(hi - 16);
  }
}

// Scale and min of sub-block j of a Q4_K block: 6 bits each, packed in 12 bytes.
void q4_k_scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int chunk = 0; chunk < 4; ++chunk) {  // 64 values: 32 bytes of qs
    for (int half_index = 0; half_index < 2; ++half_index) {
      int sc, m;
      q4_k_scale_min(2 * chunk + half_index, scales, &sc, &m);
      const float scale = d * float(sc), offset = dmin * float(m);
      for (int l = 0; l < 32; ++l) {
        const int q = half_index == 0 ? (qs[32 * chunk + l] & 0xF) : (qs[32 * chunk + l] >> 4);
        y[64 * chunk + 32 * half_index + l] = scale * float(q) - offset;
      }
    }
  }
}

void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int e = 0; e < 256; ++e) {
    // Value e: half h = e / 128; within it quarter r = (e % 128) / 32 and lane l = e % 32.
    const int h = e / 128, r = (e % 128) / 32, l = e % 32;
    const uint8_t low_byte = ql[64 * h + 32 * (r & 1) + l];
    const int low = r < 2 ? (low_byte & 0xF) : (low_byte >> 4);
    const int high = (qh[32 * h + l] >> (2 * r)) & 3;
    y[e] = d * float(sc[e / 16]) * float((low | (high << 4)) - 32);
  }
}

float scale_value(const uint8_t* p, DType dtype) {
  const uint16_t bits = load_u16(p);
  return dtype == DType::F16 ? f16_to_f32(bits) : bf16_to_f32(bits);
}

void dequant_affine_row(const WeightMatrix& w, int64_t row, float* y) {
  const AffineParams& a = w.affine;
  const int64_t groups = w.cols / a.group_size;
  const uint8_t* codes = w.data + row * w.row_bytes();
  const uint8_t* scales = a.scales + row * groups * 2;
  const uint8_t* biases = a.biases + row * groups * 2;
  const int per_word = 32 / a.bits;
  const uint32_t mask = (1u << a.bits) - 1;
  for (int64_t k = 0; k < w.cols; ++k) {
    const uint32_t word = load_u32(codes + 4 * (k / per_word));
    const uint32_t q = (word >> (a.bits * (k % per_word))) & mask;
    const int64_t g = k / a.group_size;
    y[k] = scale_value(scales + 2 * g, a.scale_dtype) * float(q) +
           scale_value(biases + 2 * g, a.scale_dtype);
  }
}

}  // namespace

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kDense:
      return "dense";
    case WeightFormat::kQ8_0:
      return "Q8_0";
    case WeightFormat::kQ4_0:
      return "Q4_0";
    case WeightFormat::kQ5_0:
      return "Q5_0";
    case WeightFormat::kQ4_K:
      return "Q4_K";
    case WeightFormat::kQ6_K:
      return "Q6_K";
    case WeightFormat::kAffine:
      return "MLX affine";
  }
  return "?";
}

BlockGeometry block_geometry(WeightFormat format) {
  switch (format) {
    case WeightFormat::kQ8_0:
      return {32, 34};
    case WeightFormat::kQ4_0:
      return {32, 18};
    case WeightFormat::kQ5_0:
      return {32, 22};
    case WeightFormat::kQ4_K:
      return {256, 144};
    case WeightFormat::kQ6_K:
      return {256, 210};
    default:
      return {};
  }
}

int64_t WeightMatrix::row_bytes() const {
  if (format == WeightFormat::kDense) return cols * int64_t(dtype_size(dtype));
  if (format == WeightFormat::kAffine) return cols * affine.bits / 8;
  const BlockGeometry g = block_geometry(format);
  return cols / g.elems * g.bytes;
}

int64_t WeightMatrix::total_bytes() const {
  int64_t bytes = rows * row_bytes();
  if (format == WeightFormat::kAffine) bytes += 2 * rows * (cols / affine.group_size) * 2;
  return bytes;
}

WeightMatrix WeightMatrix::row_slice(int64_t begin, int64_t count) const {
  TKV_DCHECK(begin >= 0 && count >= 0 && begin + count <= rows);
  WeightMatrix slice = *this;
  slice.data = data + begin * row_bytes();
  if (format == WeightFormat::kAffine) {
    const int64_t group_bytes = (cols / affine.group_size) * 2;
    slice.affine.scales = affine.scales + begin * group_bytes;
    slice.affine.biases = affine.biases + begin * group_bytes;
  }
  slice.rows = count;
  return slice;
}

void check_weight_dtype(const WeightMatrix& w) {
  if (w.format == WeightFormat::kDense) {
    if (w.dtype != DType::F32 && w.dtype != DType::F16 && w.dtype != DType::BF16) {
      throw InvalidArgument(str_cat("weight dtype ", dtype_name(w.dtype),
                                    " is not supported (allowed: F32, F16, BF16)"));
    }
    return;
  }
  if (w.format == WeightFormat::kAffine) {
    const AffineParams& a = w.affine;
    if (a.bits != 2 && a.bits != 4 && a.bits != 8) {
      throw InvalidArgument(
          str_cat("MLX affine weight has ", a.bits, " bits (supported: 2, 4, 8)"));
    }
    if (a.group_size != 32 && a.group_size != 64 && a.group_size != 128) {
      throw InvalidArgument(
          str_cat("MLX affine weight has group size ", a.group_size, " (supported: 32, 64, 128)"));
    }
    if (a.scale_dtype != DType::F16 && a.scale_dtype != DType::BF16) {
      throw InvalidArgument(str_cat("MLX affine scales have dtype ", dtype_name(a.scale_dtype),
                                    " (supported: F16, BF16)"));
    }
    if (w.cols % a.group_size != 0) {
      throw InvalidArgument(str_cat("MLX affine weight [", w.rows, ", ", w.cols,
                                    "]: columns are not a multiple of the group size ",
                                    a.group_size));
    }
    return;
  }
  const BlockGeometry g = block_geometry(w.format);
  if (g.elems == 0 || w.cols % g.elems != 0) {
    throw InvalidArgument(str_cat(weight_format_name(w.format), " weight [", w.rows, ", ", w.cols,
                                  "]: columns are not a multiple of the block size ", g.elems));
  }
}

void dequantize_rows_ref(const WeightMatrix& w, int64_t begin, int64_t count, float* out) {
  check_weight_dtype(w);
  if (w.format == WeightFormat::kDense) return widen_rows_ref(w, begin, count, out);
  for (int64_t r = 0; r < count; ++r) {
    float* y = out + r * w.cols;
    if (w.format == WeightFormat::kAffine) {
      dequant_affine_row(w, begin + r, y);
      continue;
    }
    const BlockGeometry g = block_geometry(w.format);
    const uint8_t* row = w.data + (begin + r) * w.row_bytes();
    for (int64_t b = 0; b < w.cols / g.elems; ++b) {
      const uint8_t* block = row + b * g.bytes;
      float* yb = y + b * g.elems;
      switch (w.format) {
        case WeightFormat::kQ8_0:
          dequant_q8_0(block, yb);
          break;
        case WeightFormat::kQ4_0:
          dequant_q4_0(block, yb);
          break;
        case WeightFormat::kQ5_0:
          dequant_q5_0(block, yb);
          break;
        case WeightFormat::kQ4_K:
          dequant_q4_k(block, yb);
          break;
        default:
          dequant_q6_k(block, yb);
          break;
      }
    }
  }
}

bool uses_nibble_order(const WeightMatrix& w) {
  return w.format == WeightFormat::kAffine && w.affine.bits == 4;
}

// Position in the natural order of element k of a stored 32-window.
static int64_t natural_index(int64_t k, bool nibble_order) {
  if (!nibble_order) return k;
  const int64_t base = k & ~int64_t(31), j = k & 31;
  return base + (j < 16 ? 2 * j : 2 * (j - 16) + 1);
}

ActivationBlocks quantize_activations(const float* x, int64_t m, int64_t cols, bool nibble_order) {
  if (cols % 32 != 0) {
    throw InvalidArgument(str_cat("int8 activations need a multiple of 32 columns, got ", cols));
  }
  ActivationBlocks a;
  a.m = m;
  a.cols = cols;
  a.nibble_order = nibble_order;
  a.q.resize(size_t(m * cols));
  a.d.resize(size_t(m * cols / 32));
  a.dsum.resize(a.d.size());
  a.sum4.resize(size_t(m * cols / 4));
  a.d4.resize(a.sum4.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* xb = x + i * cols + 32 * b;
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(xb[j]));
      const float d = amax / 127.0f;
      const float inv = d > 0 ? 1.0f / d : 0.0f;
      int8_t* qb = a.q.data() + i * cols + 32 * b;
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        const int q = int(std::nearbyint(xb[natural_index(j, nibble_order)] * inv));
        qb[j] = int8_t(std::clamp(q, -127, 127));
        sum += qb[j];
      }
      for (int l = 0; l < 8; ++l) {
        const size_t at = size_t(i * cols / 4 + 8 * b + l);
        a.sum4[at] = qb[4 * l] + qb[4 * l + 1] + qb[4 * l + 2] + qb[4 * l + 3];
        a.d4[at] = d;
      }
      a.d[size_t(i * cols / 32 + b)] = d;
      a.dsum[size_t(i * cols / 32 + b)] = d * float(sum);
    }
  }
  return a;
}

void qmatmul_rows_ref(const ActivationBlocks& x, const WeightMatrix& w, int64_t row_begin,
                      int64_t row_end, float* y) {
  std::vector<float> row(size_t(w.cols));
  for (int64_t n = row_begin; n < row_end; ++n) {
    dequantize_rows_ref(w, n, 1, row.data());
    for (int64_t i = 0; i < x.m; ++i) {
      double sum = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        const double xk = double(x.d[size_t((i * w.cols + k) / 32)]) * x.q[size_t(i * w.cols + k)];
        sum += xk * row[size_t(natural_index(k, x.nibble_order))];
      }
      y[i * w.rows + n] = float(sum);
    }
  }
}

bool f32_reference_mode() {
  static const bool enabled = env_flag("TURBOKV_F32_ACTIVATIONS");
  return enabled;
}

bool int8_activations_enabled() {
  static const bool enabled = !f32_reference_mode() && cpu_has_avx2();
  return enabled;
}

}  // namespace turbokv
