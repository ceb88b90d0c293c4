// quant_matmul and dequantize_to_bf16 (kernels/cuda/qmatmul.h) on random blocks of every
// weight format, against the CPU reference dequantization (dequantize_rows_ref) with sums in
// double:
//   - m <= 8, the GEMV on the blocks (fp32):  |y - ref| <= 1e-5 · Σ_k |w_nk x_ik| per output,
//   - m > 8, bf16 panels + cuBLAS: against the same sums over w and x rounded to bf16,
//     |y - ref_bf16| <= 2e-3 · Σ_k |w_nk x_ik| (fp32 accumulation on the tensor cores),
//   - dequantize_to_bf16: every value equals bf16(reference value) bit for bit,
//   - quant_gather_rows: equals gather_rows_ref bit for bit,
//   - row slices and fused uploads (upload_quant_rows) compute what the whole matrix / the
//     parts alone compute, bit for bit,
// each output inside guard values that must stay untouched, and no NaN or Inf. Shapes cover
// rows that do not fill the kernels' 16-row blocks, rows starting at every 2-byte alignment
// (block counts that are not multiples of 8), and more columns than one GEMV pass stages.
// The argument checks run without a GPU.
#include "kernels/cuda/qmatmul.h"

#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "tests/common/random.h"
#include "tests/common/random_weights.h"
#include "tests/cuda/test_util.h"

namespace turbokv::cuda {
namespace {

struct FormatCase {
  const char* name;
  WeightFormat format;
  int bits = 0;        // kAffine
  int group_size = 0;  // kAffine
  DType scale_dtype = DType::BF16;
};

const FormatCase kFormats[] = {
    {"Q8_0", WeightFormat::kQ8_0},
    {"Q4_0", WeightFormat::kQ4_0},
    {"Q5_0", WeightFormat::kQ5_0},
    {"Q4_K", WeightFormat::kQ4_K},
    {"Q6_K", WeightFormat::kQ6_K},
    {"MLX4_g64_bf16", WeightFormat::kAffine, 4, 64, DType::BF16},
    {"MLX4_g32_f16", WeightFormat::kAffine, 4, 32, DType::F16},
    {"MLX4_g128_bf16", WeightFormat::kAffine, 4, 128, DType::BF16},
    {"MLX8_g64_bf16", WeightFormat::kAffine, 8, 64, DType::BF16},
    {"MLX8_g32_f16", WeightFormat::kAffine, 8, 32, DType::F16},
    {"MLX2_g32_bf16", WeightFormat::kAffine, 2, 32, DType::BF16},
    {"MLX2_g128_f16", WeightFormat::kAffine, 2, 128, DType::F16},
};

struct Shape {
  int64_t rows, cols;
};

// Columns come in blocks (32 or 256) or groups; the second shape has an odd number of them
// (rows at every 2-byte alignment), the third needs two GEMV passes at m = 1.
std::vector<Shape> shapes_for(const FormatCase& f) {
  int64_t unit = 32;
  if (f.format == WeightFormat::kQ4_K || f.format == WeightFormat::kQ6_K) unit = 256;
  if (f.format == WeightFormat::kAffine) unit = f.group_size;
  return {{37, 256}, {21, 7 * unit}, {17, 512}, {3, 14592}};
}

const int64_t kRowCounts[] = {1, 2, 3, 8, 9, 64, 300};

constexpr uint32_t kGuardBits = 0x7FC0DEADu;  // a NaN that no kernel writes
constexpr uint16_t kGuardBf16 = 0xFFC1u;      // likewise
constexpr int64_t kGuardFloats = 5;           // before y, and at the end of each row

float round_bf16(float v) {
  return bf16_to_f32(f32_to_bf16(v));
}

// Failed checks of one comparison: how many, and the first few described.
class Mismatches {
 public:
  void add(const std::string& what) {
    if (count_++ < 6) first_ << "\n  " << what;
  }
  int64_t count() const { return count_; }
  std::string first() const { return first_.str(); }

 private:
  int64_t count_ = 0;
  std::ostringstream first_;
};

struct Reference {
  std::vector<double> y;      // [m, rows]
  std::vector<double> bound;  // [m, rows] allowed |error|
};

Reference reference_product(const std::vector<float>& w, const std::vector<float>& x, int64_t m,
                            int64_t rows, int64_t cols, double tolerance) {
  Reference ref;
  ref.y.resize(size_t(m * rows));
  ref.bound.resize(ref.y.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = 0; n < rows; ++n) {
      double sum = 0, magnitude = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = double(w[size_t(n * cols + k)]) * double(x[size_t(i * cols + k)]);
        sum += p;
        magnitude += std::abs(p);
      }
      ref.y[size_t(i * rows + n)] = sum;
      ref.bound[size_t(i * rows + n)] = tolerance * magnitude + 1e-30;
    }
  }
  return ref;
}

// buffer: kGuardFloats guards, then m rows of ldy = rows + kGuardFloats floats of which the
// first `rows` are y. Every output within its bound and finite, every other float untouched.
void check_outputs(const std::string& what, const std::vector<float>& buffer, int64_t m,
                   int64_t rows, const Reference& ref) {
  const int64_t ldy = rows + kGuardFloats;
  Mismatches bad;
  for (size_t p = 0; p < buffer.size(); ++p) {
    const int64_t at = int64_t(p) - kGuardFloats;
    const bool output = at >= 0 && at / ldy < m && at % ldy < rows;
    if (output) {
      const int64_t i = at / ldy, n = at % ldy;
      const double want = ref.y[size_t(i * rows + n)], bound = ref.bound[size_t(i * rows + n)];
      const float got = buffer[p];
      if (!(std::isfinite(got) && std::abs(double(got) - want) <= bound)) {
        bad.add(str_cat("y[", i, ", ", n, "] = ", got, ", expected ", want, " +- ", bound));
      }
    } else if (float_bits(buffer[p]) != kGuardBits) {
      bad.add(str_cat("guard float ", p, " overwritten with ", buffer[p]));
    }
  }
  if (bad.count() > 0) ADD_FAILURE() << what << ": " << bad.count() << " bad values" << bad.first();
}

struct Blas {
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  Blas() {
    TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(handle, stream) != CUBLAS_STATUS_SUCCESS) {
      throw Error("cublasCreate / cublasSetStream failed");
    }
  }
  ~Blas() {
    if (handle != nullptr) cublasDestroy(handle);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

std::string describe(const FormatCase& f, const Shape& s) {
  return str_cat(f.name, " [", s.rows, ", ", s.cols, "]");
}

turbokv::testing::RandomWeight make_weight(const FormatCase& f, const Shape& s, uint32_t seed) {
  return turbokv::testing::random_weight(f.format, f.bits, s.rows, s.cols, seed, f.group_size,
                                         f.scale_dtype);
}

std::vector<float> dequantized(const WeightMatrix& w) {
  std::vector<float> out(size_t(w.rows * w.cols));
  dequantize_rows_ref(w, 0, w.rows, out.data());
  return out;
}

// Runs quant_matmul for m rows into a guarded buffer and returns the whole buffer.
std::vector<float> run_product(const QuantWeightsView& w, const DeviceBuffer<float>& x, int64_t m,
                               QuantScratch& scratch, const Blas& blas) {
  const int64_t ldy = w.rows + kGuardFloats;
  DeviceBuffer<float> y = DeviceBuffer<float>::upload(
      std::vector<float>(size_t(kGuardFloats + m * ldy), bits_float(kGuardBits)));
  quant_matmul(w, x.data(), m, y.data() + kGuardFloats, ldy, scratch, blas.handle, blas.stream);
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(blas.stream));
  return y.download();
}

// x as the int8 GEMV sees it: the CPU's int8 activation blocks (quantize_activations in MLX
// nibble order), dequantized back to natural order.
std::vector<float> int8_rounded(const std::vector<float>& x) {
  const auto cols = int64_t(x.size());
  const ActivationBlocks blocks = quantize_activations(x.data(), 1, cols, true);
  std::vector<float> out(x.size());
  for (int64_t k = 0; k < cols; ++k) {
    const int64_t base = k & ~int64_t(31), j = k & 31;
    const int64_t natural = base + (j < 16 ? 2 * j : 2 * (j - 16) + 1);
    out[size_t(natural)] = blocks.d[size_t(k / 32)] * float(blocks.q[size_t(k)]);
  }
  return out;
}

class QuantMatmulTest : public testing::CudaTest,
                        public ::testing::WithParamInterface<FormatCase> {};

TEST_P(QuantMatmulTest, ProductsMatchReference) {
  const FormatCase& f = GetParam();
  const Blas blas;
  uint32_t seed = 1;
  for (const Shape& s : shapes_for(f)) {
    const turbokv::testing::RandomWeight host = make_weight(f, s, seed++);
    const std::vector<float> w = dequantized(host.w);
    std::vector<float> w_bf16(w.size());
    for (size_t j = 0; j < w.size(); ++j) w_bf16[j] = round_bf16(w[j]);
    const DeviceQuantMatrix device = upload_quant_matrix(host.w);
    // Panels of 8 rows: several panels, the last one partial, for the cuBLAS path.
    QuantScratch scratch(300, s.cols, 8 * s.cols);
    for (const int64_t m : kRowCounts) {
      const std::vector<float> x = turbokv::testing::random_normal(size_t(m * s.cols), seed++);
      const DeviceBuffer<float> x_device = DeviceBuffer<float>::upload(x);
      const std::vector<float> got = run_product(device.view, x_device, m, scratch, blas);
      const std::string what = str_cat(describe(f, s), " m=", m);
      if (m == 1 && gpu_int8_activations_enabled() && quant_gemv_int8_supported(device.view)) {
        check_outputs(what + " (int8 GEMV)", got, m, s.rows,
                      reference_product(w, int8_rounded(x), m, s.rows, s.cols, 1e-5));
      } else if (m <= kQuantGemvMaxRows) {
        check_outputs(what + " (GEMV)", got, m, s.rows,
                      reference_product(w, x, m, s.rows, s.cols, 1e-5));
      } else {
        std::vector<float> x_bf16(x.size());
        for (size_t j = 0; j < x.size(); ++j) x_bf16[j] = round_bf16(x[j]);
        check_outputs(what + " (bf16 + cuBLAS)", got, m, s.rows,
                      reference_product(w_bf16, x_bf16, m, s.rows, s.cols, 2e-3));
      }
    }
  }
}

// The fp32 GEMV for any m (the reference mode's prefill): the m > 8 rows in passes of 8, each
// within the GEMV's bound, guards untouched.
TEST_P(QuantMatmulTest, GemvForAnyRowCountMatchesReference) {
  const FormatCase& f = GetParam();
  const Blas blas;
  uint32_t seed = 900;
  for (const Shape& s : shapes_for(f)) {
    const turbokv::testing::RandomWeight host = make_weight(f, s, seed++);
    const std::vector<float> w = dequantized(host.w);
    const DeviceQuantMatrix device = upload_quant_matrix(host.w);
    for (const int64_t m : {int64_t(9), int64_t(17), int64_t(64)}) {
      const std::vector<float> x = turbokv::testing::random_normal(size_t(m * s.cols), seed++);
      const DeviceBuffer<float> x_device = DeviceBuffer<float>::upload(x);
      const int64_t ldy = s.rows + kGuardFloats;
      DeviceBuffer<float> y = DeviceBuffer<float>::upload(
          std::vector<float>(size_t(kGuardFloats + m * ldy), bits_float(kGuardBits)));
      quant_matmul_gemv(device.view, x_device.data(), m, y.data() + kGuardFloats, ldy,
                        blas.stream);
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(blas.stream));
      check_outputs(str_cat(describe(f, s), " m=", m, " (GEMV passes)"), y.download(), m, s.rows,
                    reference_product(w, x, m, s.rows, s.cols, 1e-5));
    }
  }
}

// A row slice (data, scales and biases offset by whole rows, so GGUF rows keep their byte
// alignments) computes exactly what the full matrix computes for those rows.
TEST_P(QuantMatmulTest, RowSliceMatchesFullMatrix) {
  const FormatCase& f = GetParam();
  const Blas blas;
  const Shape s = shapes_for(f)[1];  // rows at every 2-byte alignment
  const turbokv::testing::RandomWeight host = make_weight(f, s, 77);
  const DeviceQuantMatrix device = upload_quant_matrix(host.w);
  QuantScratch none;
  const int64_t begin = 5, count = 13;
  const QuantWeightsView slice = device.view.row_slice(begin, count);
  for (const int64_t m : {int64_t(2), int64_t(8)}) {
    const DeviceBuffer<float> x =
        DeviceBuffer<float>::upload(turbokv::testing::random_normal(size_t(m * s.cols), 78));
    const std::vector<float> full = run_product(device.view, x, m, none, blas);
    const std::vector<float> part = run_product(slice, x, m, none, blas);
    Mismatches bad;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t n = 0; n < count; ++n) {
        const float a = full[size_t(kGuardFloats + i * (s.rows + kGuardFloats) + begin + n)];
        const float b = part[size_t(kGuardFloats + i * (count + kGuardFloats) + n)];
        if (float_bits(a) != float_bits(b)) {
          bad.add(str_cat("y[", i, ", ", begin + n, "]: full ", a, ", slice ", b));
        }
      }
    }
    EXPECT_EQ(bad.count(), 0) << describe(f, s) << " rows [" << begin << ", " << begin + count
                              << ") m=" << m << bad.first();
  }
  DeviceBuffer<uint16_t> from_full(size_t(count * s.cols)), from_slice(size_t(count * s.cols));
  dequantize_to_bf16(device, begin, count, reinterpret_cast<__nv_bfloat16*>(from_full.data()),
                     nullptr);
  dequantize_to_bf16(slice, 0, count, reinterpret_cast<__nv_bfloat16*>(from_slice.data()), nullptr);
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  EXPECT_TRUE(from_full.download() == from_slice.download())
      << describe(f, s) << ": dequantize_to_bf16 of the slice differs from rows [" << begin << ", "
      << begin + count << ")";
}

TEST_P(QuantMatmulTest, DequantizeToBf16EqualsReference) {
  const FormatCase& f = GetParam();
  uint32_t seed = 100;
  for (const Shape& s : shapes_for(f)) {
    const turbokv::testing::RandomWeight host = make_weight(f, s, seed++);
    const std::vector<float> w = dequantized(host.w);
    const DeviceQuantMatrix device = upload_quant_matrix(host.w);
    for (const int64_t begin : {int64_t(0), int64_t(1)}) {
      const int64_t rows = s.rows - begin;
      const int64_t guard = 64;  // bf16 values on each side (128 bytes: out stays aligned)
      DeviceBuffer<uint16_t> out = DeviceBuffer<uint16_t>::upload(
          std::vector<uint16_t>(size_t(2 * guard + rows * s.cols), kGuardBf16));
      dequantize_to_bf16(device, begin, rows, reinterpret_cast<__nv_bfloat16*>(out.data() + guard),
                         nullptr);
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(nullptr));
      const std::vector<uint16_t> got = out.download();
      Mismatches bad;
      for (size_t p = 0; p < got.size(); ++p) {
        const int64_t at = int64_t(p) - guard;
        uint16_t want = kGuardBf16;
        std::string where = str_cat("guard ", p);
        if (at >= 0 && at < rows * s.cols) {
          want = f32_to_bf16(w[size_t(begin * s.cols + at)]);
          where = str_cat("w[", begin + at / s.cols, ", ", at % s.cols, "]");
        }
        if (got[p] != want) bad.add(str_cat(where, " = bf16 bits ", got[p], ", expected ", want));
      }
      EXPECT_EQ(bad.count(), 0) << describe(f, s) << " rows from " << begin << bad.first();
    }
  }
}

// Embedding lookups: rows by id (repeats, the last row) times a scale, bit for bit
// gather_rows_ref; an id outside the matrix gives a NaN row and nothing else changes.
TEST_P(QuantMatmulTest, GatherRowsEqualsReference) {
  const FormatCase& f = GetParam();
  const Shape s = shapes_for(f)[1];
  const turbokv::testing::RandomWeight host = make_weight(f, s, 91);
  const DeviceQuantMatrix device = upload_quant_matrix(host.w);
  const int32_t last = int32_t(s.rows - 1), outside = int32_t(s.rows);
  const std::vector<int32_t> ids = {3, 0, last, 3, 7, outside, 1};
  const std::vector<int32_t> valid = {3, 0, last, 3, 7, 1};
  const float scale = 1.7f;
  std::vector<float> want(valid.size() * size_t(s.cols));
  gather_rows_ref(host.w, valid.data(), int64_t(valid.size()), scale, want.data());
  const int64_t n = int64_t(ids.size()), guard = 8;  // floats on each side (32 bytes)
  DeviceBuffer<float> out = DeviceBuffer<float>::upload(
      std::vector<float>(size_t(2 * guard + n * s.cols), bits_float(kGuardBits)));
  const DeviceBuffer<int32_t> ids_device = DeviceBuffer<int32_t>::upload(ids);
  quant_gather_rows(device, ids_device.data(), n, scale, out.data() + guard, nullptr);
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  const std::vector<float> got = out.download();
  Mismatches bad;
  for (size_t p = 0; p < got.size(); ++p) {
    const int64_t at = int64_t(p) - guard;
    bool ok;
    std::string where;
    if (at < 0 || at >= n * s.cols) {
      ok = float_bits(got[p]) == kGuardBits;
      where = str_cat("guard float ", p);
    } else {
      const int64_t i = at / s.cols, k = at % s.cols;
      where = str_cat("out[", i, ", ", k, "] (id ", ids[size_t(i)], ")");
      if (ids[size_t(i)] == outside) {
        ok = std::isnan(got[p]);
      } else {
        const size_t j = size_t(i < 5 ? i : i - 1);  // row of `valid`
        ok = float_bits(got[p]) == float_bits(want[j * size_t(s.cols) + size_t(k)]);
      }
    }
    if (!ok) bad.add(str_cat(where, " = ", got[p]));
  }
  EXPECT_EQ(bad.count(), 0) << describe(f, s) << bad.first();
}

// Parts uploaded as one matrix (a fused q|k|v) compute exactly what they compute alone.
TEST_P(QuantMatmulTest, FusedUploadMatchesParts) {
  const FormatCase& f = GetParam();
  const Blas blas;
  const int64_t cols = shapes_for(f)[1].cols;
  const turbokv::testing::RandomWeight a = make_weight(f, {5, cols}, 201);
  const turbokv::testing::RandomWeight b = make_weight(f, {3, cols}, 202);
  const turbokv::testing::RandomWeight c = make_weight(f, {9, cols}, 203);
  const DeviceQuantMatrix fused = upload_quant_rows({&a.w, &b.w, &c.w});
  ASSERT_EQ(fused.view.rows, 17);
  QuantScratch none;
  const int64_t m = 3;
  const DeviceBuffer<float> x =
      DeviceBuffer<float>::upload(turbokv::testing::random_normal(size_t(m * cols), 204));
  const std::vector<float> all = run_product(fused.view, x, m, none, blas);
  int64_t offset = 0;
  Mismatches bad;
  for (const turbokv::testing::RandomWeight* part : {&a, &b, &c}) {
    const DeviceQuantMatrix alone = upload_quant_matrix(part->w);
    const std::vector<float> y = run_product(alone.view, x, m, none, blas);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t n = 0; n < part->w.rows; ++n) {
        const float want = y[size_t(kGuardFloats + i * (part->w.rows + kGuardFloats) + n)];
        const float got = all[size_t(kGuardFloats + i * (17 + kGuardFloats) + offset + n)];
        if (float_bits(want) != float_bits(got)) {
          bad.add(str_cat("y[", i, ", ", offset + n, "] = ", got, ", alone ", want));
        }
      }
    }
    offset += part->w.rows;
  }
  EXPECT_EQ(bad.count(), 0) << f.name << " [17, " << cols << "] from parts of 5, 3, 9 rows"
                            << bad.first();
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantMatmulTest, ::testing::ValuesIn(kFormats),
                         [](const ::testing::TestParamInfo<FormatCase>& info) {
                           return std::string(info.param.name);
                         });

// Bad arguments are rejected before any device work (fake, aligned device pointers).
// The int8-activation GEMV of MLX 4-bit weights, every kernel shape: against the double-sum product of the
// reference dequantized weights with the CPU's int8 activation blocks (quantize_activations in
// MLX nibble order, dequantized back to natural order), so the GPU must quantize x to the same
// codes: within 1e-5 of Σ|w·x| per output, guards untouched.
class QuantGemvInt8Test : public testing::CudaTest {};

TEST_F(QuantGemvInt8Test, MatchesReferenceOnCpuInt8Blocks) {
  const Blas blas;
  uint32_t seed = 500;
  for (const FormatCase& f : kFormats) {
    if (f.format != WeightFormat::kAffine || f.bits != 4) continue;
    for (const Shape& s : shapes_for(f)) {
      const turbokv::testing::RandomWeight host = make_weight(f, s, seed++);
      const DeviceQuantMatrix device = upload_quant_matrix(host.w);
      ASSERT_TRUE(quant_gemv_int8_supported(device.view));
      const std::vector<float> x = turbokv::testing::random_normal(size_t(s.cols), seed++);
      const std::vector<float> x_int8 = int8_rounded(x);
      const DeviceBuffer<float> x_device = DeviceBuffer<float>::upload(x);
      DeviceBuffer<uint8_t> workspace(size_t(quant_gemv_int8_workspace_bytes(s.cols)));
      const Reference want =
          reference_product(dequantized(host.w), x_int8, 1, s.rows, s.cols, 1e-5);
      for (int shape = 0; shape < kInt8GemvShapes; ++shape) {
        DeviceBuffer<float> y = DeviceBuffer<float>::upload(std::vector<float>(
            size_t(kGuardFloats + s.rows + kGuardFloats), bits_float(kGuardBits)));
        quant_gemv_int8(device.view, x_device.data(), y.data() + kGuardFloats, workspace.data(),
                        blas.stream, Int8GemvShape(shape));
        TURBOKV_CUDA_CHECK(cudaStreamSynchronize(blas.stream));
        check_outputs(describe(f, s) + " (int8 GEMV, " +
                          int8_gemv_shape_name(Int8GemvShape(shape)) + ")",
                      y.download(), 1, s.rows, want);
      }
    }
  }
}

TEST(QuantMatmulArgs, RejectedBeforeLaunch) {
  const auto* fake = reinterpret_cast<const uint8_t*>(uintptr_t(1) << 20);
  QuantWeightsView w;
  w.format = WeightFormat::kQ4_0;
  w.rows = 4;
  w.cols = 64;
  w.data = fake;
  const auto* x = reinterpret_cast<const float*>(fake + 4096);
  auto* y = reinterpret_cast<float*>(uintptr_t(1) << 21);
  QuantScratch none;
  EXPECT_THROW(quant_matmul(w, x, 1, y, 3, none, nullptr, nullptr), InvalidArgument);  // ldy
  EXPECT_THROW(quant_matmul(w, x, -1, y, 4, none, nullptr, nullptr), InvalidArgument);
  EXPECT_THROW(quant_matmul(w, x + 1, 1, y, 4, none, nullptr, nullptr), InvalidArgument);
  EXPECT_THROW(quant_matmul(w, x, 9, y, 4, none, nullptr, nullptr), InvalidArgument);  // scratch
  QuantWeightsView bad = w;
  bad.cols = 48;  // not whole blocks
  EXPECT_THROW(quant_matmul(bad, x, 1, y, 4, none, nullptr, nullptr), InvalidArgument);
  bad = w;
  bad.data = fake + 1;  // odd address
  EXPECT_THROW(quant_matmul(bad, x, 1, y, 4, none, nullptr, nullptr), InvalidArgument);
  bad = w;
  bad.format = WeightFormat::kQ4_K;
  bad.cols = 256;
  bad.data = fake + 2;  // Q4_K blocks are read with 16-byte loads
  EXPECT_THROW(quant_matmul(bad, x, 1, y, 4, none, nullptr, nullptr), InvalidArgument);
  bad = w;
  bad.format = WeightFormat::kAffine;
  bad.bits = 3;
  bad.group_size = 64;
  bad.scales = bad.biases = fake;
  EXPECT_THROW(quant_matmul(bad, x, 1, y, 4, none, nullptr, nullptr), InvalidArgument);
  bad = w;
  bad.format = WeightFormat::kDense;
  EXPECT_THROW(quant_matmul(bad, x, 1, y, 4, none, nullptr, nullptr), InvalidArgument);
  auto* out = reinterpret_cast<__nv_bfloat16*>(uintptr_t(1) << 21);
  EXPECT_THROW(dequantize_to_bf16(w, 2, 3, out, nullptr), InvalidArgument);  // rows past the end
  EXPECT_THROW(dequantize_to_bf16(w, 0, 2, out + 1, nullptr), InvalidArgument);  // misaligned
  EXPECT_THROW(w.row_slice(3, 2), InvalidArgument);
  const std::vector<uint8_t> dense_bytes(64 * 4 * 2);
  const WeightMatrix dense(DType::BF16, dense_bytes.data(), 4, 64);
  EXPECT_THROW(upload_quant_matrix(dense), InvalidArgument);
  const turbokv::testing::RandomWeight q4 =
      turbokv::testing::random_weight(WeightFormat::kQ4_0, 0, 4, 64, 1);
  const turbokv::testing::RandomWeight q8 =
      turbokv::testing::random_weight(WeightFormat::kQ8_0, 0, 4, 64, 1);
  const turbokv::testing::RandomWeight wide =
      turbokv::testing::random_weight(WeightFormat::kQ4_0, 0, 4, 96, 1);
  EXPECT_THROW(upload_quant_rows({&q4.w, &q8.w}), InvalidArgument);    // formats differ
  EXPECT_THROW(upload_quant_rows({&q4.w, &wide.w}), InvalidArgument);  // cols differ
  EXPECT_THROW(upload_quant_rows({}), InvalidArgument);
  const auto* ids = reinterpret_cast<const int32_t*>(fake);
  EXPECT_THROW(quant_gather_rows(w, ids, -1, 1.0f, y, nullptr), InvalidArgument);
  EXPECT_THROW(quant_gather_rows(w, ids, 2, 1.0f, y + 1, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::cuda
