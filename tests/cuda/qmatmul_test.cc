// quant_matmul and dequantize_to_bf16 (kernels/cuda/qmatmul.h) on random blocks of every
// weight format, against the CPU reference dequantization (dequantize_rows_ref) with sums in
// double:
//   - m <= 8, the GEMV on the blocks (fp32):  |y - ref| <= 1e-5 · Σ_k |w_nk x_ik| per output,
//   - m > 8, bf16 panels + cuBLAS: against the same sums over w and x rounded to bf16,
//     |y - ref_bf16| <= 2e-3 · Σ_k |w_nk x_ik| (fp32 accumulation on the tensor cores),
//   - dequantize_to_bf16: every value equals bf16(reference value) bit for bit,
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
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t p = 0; p < buffer.size(); ++p) {
    const int64_t at = int64_t(p) - kGuardFloats;
    const bool output = at >= 0 && at / ldy < m && at % ldy < rows;
    if (output) {
      const int64_t i = at / ldy, n = at % ldy;
      const double want = ref.y[size_t(i * rows + n)], bound = ref.bound[size_t(i * rows + n)];
      const float got = buffer[p];
      if (std::isfinite(got) && std::abs(double(got) - want) <= bound) continue;
      if (bad++ < 6) {
        first << "\n  y[" << i << ", " << n << "] = " << got << ", expected " << want << " +- "
              << bound;
      }
    } else if (float_bits(buffer[p]) != kGuardBits) {
      if (bad++ < 6) first << "\n  guard float " << p << " overwritten with " << buffer[p];
    }
  }
  if (bad > 0) ADD_FAILURE() << what << ": " << bad << " bad values" << first.str();
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
      if (m <= kQuantGemvMaxRows) {
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
    int64_t bad = 0;
    std::ostringstream first;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t n = 0; n < count; ++n) {
        const float a = full[size_t(kGuardFloats + i * (s.rows + kGuardFloats) + begin + n)];
        const float b = part[size_t(kGuardFloats + i * (count + kGuardFloats) + n)];
        if (float_bits(a) == float_bits(b)) continue;
        if (bad++ < 6) {
          first << "\n  y[" << i << ", " << begin + n << "]: full " << a << ", slice " << b;
        }
      }
    }
    EXPECT_EQ(bad, 0) << describe(f, s) << " rows [" << begin << ", " << begin + count
                      << ") m=" << m << first.str();
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
      int64_t bad = 0;
      std::ostringstream first;
      for (size_t p = 0; p < got.size(); ++p) {
        const int64_t at = int64_t(p) - guard;
        uint16_t want = kGuardBf16;
        std::string where = str_cat("guard ", p);
        if (at >= 0 && at < rows * s.cols) {
          want = f32_to_bf16(w[size_t(begin * s.cols + at)]);
          where = str_cat("w[", begin + at / s.cols, ", ", at % s.cols, "]");
        }
        if (got[p] == want) continue;
        if (bad++ < 6) {
          first << "\n  " << where << " = 0x" << std::hex << got[p] << ", expected 0x" << want
                << std::dec;
        }
      }
      EXPECT_EQ(bad, 0) << describe(f, s) << " rows from " << begin << first.str();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantMatmulTest, ::testing::ValuesIn(kFormats),
                         [](const ::testing::TestParamInfo<FormatCase>& info) {
                           return std::string(info.param.name);
                         });

// Bad arguments are rejected before any device work (fake, aligned device pointers).
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
  EXPECT_THROW(upload_quant_matrix(WeightMatrix(DType::BF16, dense_bytes.data(), 4, 64)),
               InvalidArgument);
}

}  // namespace
}  // namespace turbokv::cuda
