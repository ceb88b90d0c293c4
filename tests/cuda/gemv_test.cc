// The decode GEMV (gemv.h) against a double-precision CPU product of the same fp16 / bf16
// values, and Gemm::run's small-m path against cuBLAS (the same call with TURBOKV_GEMV=0 is
// cuBLAS; here both are checked against the CPU product).
#include "kernels/cuda/gemv.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "test_util.h"

namespace turbokv::cuda {
namespace {

using testing::CudaTest;

class CudaGemv : public CudaTest {};

struct Problem {
  int64_t m, n, k;
  Elem elem;
};

std::vector<uint16_t> narrow(const std::vector<float>& x, Elem e) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = e == Elem::kBF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
  }
  return out;
}
float widen(uint16_t h, Elem e) { return e == Elem::kBF16 ? bf16_to_f32(h) : f16_to_f32(h); }

// Runs y = x · wᵀ (+ y0 when accumulate) through `product` and checks every element against
// the double product of the narrowed values, relative to Σ |x_i w_i|.
template <typename Product>
void check(const Problem& p, bool accumulate, uint64_t seed, Product product) {
  SCOPED_TRACE(::testing::Message() << "m " << p.m << " n " << p.n << " k " << p.k
                                    << (p.elem == Elem::kBF16 ? " bf16" : " f16")
                                    << (accumulate ? " accumulate" : ""));
  const std::vector<uint16_t> x = narrow(testing::random_normal(size_t(p.m * p.k), seed), p.elem);
  const std::vector<uint16_t> w =
      narrow(testing::random_normal(size_t(p.n * p.k), seed + 1, 0.05f), p.elem);
  const int64_t ldy = p.n + 3;
  const std::vector<float> y0 = testing::random_normal(size_t(p.m * ldy), seed + 2);
  auto d_x = DeviceBuffer<uint16_t>::upload(x);
  auto d_w = DeviceBuffer<uint16_t>::upload(w);
  auto d_y = DeviceBuffer<float>::upload(y0);
  product(d_x.data(), d_w.data(), d_y.data(), ldy);
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> y = d_y.download();
  for (int64_t r = 0; r < p.m; ++r) {
    for (int64_t j = 0; j < p.n; ++j) {
      double want = accumulate ? double(y0[size_t(r * ldy + j)]) : 0.0, mag = 0;
      for (int64_t i = 0; i < p.k; ++i) {
        const double t = double(widen(x[size_t(r * p.k + i)], p.elem)) *
                         double(widen(w[size_t(j * p.k + i)], p.elem));
        want += t;
        mag += std::fabs(t);
      }
      ASSERT_NEAR(y[size_t(r * ldy + j)], want, 2e-6 * mag + 1e-6) << "row " << r << " col " << j;
    }
    // Padding columns of y (ldy > n) are untouched.
    for (int64_t j = p.n; j < ldy; ++j) ASSERT_EQ(y[size_t(r * ldy + j)], y0[size_t(r * ldy + j)]);
  }
}

TEST_F(CudaGemv, MatchesDoubleProduct) {
  const Problem problems[] = {{1, 100, 4096, Elem::kBF16}, {1, 9, 1024, Elem::kF16},
                              {3, 33, 136, Elem::kBF16},   {8, 17, 8, Elem::kBF16},
                              {5, 64, 14336, Elem::kF16},  {2, 1, 1000, Elem::kBF16}};
  uint64_t seed = 10;
  for (const Problem& p : problems) {
    for (bool accumulate : {false, true}) {
      check(p, accumulate, seed++, [&](const void* x, const void* w, float* y, int64_t ldy) {
        gemv(x, w, p.elem, p.m, p.n, p.k, y, ldy, accumulate, nullptr);
      });
    }
  }
}

TEST_F(CudaGemv, GemmRunTakesItForFewRows) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreate(&stream));
  {
    Gemm gemm(stream);
    for (const Problem& p : {Problem{1, 300, 512, Elem::kBF16}, Problem{8, 40, 256, Elem::kF16},
                             Problem{9, 40, 256, Elem::kBF16}}) {  // 9 rows: cuBLAS
      check(p, false, 77, [&](const void* x, const void* w, float* y, int64_t ldy) {
        gemm.run(x, w, p.elem, p.m, p.n, p.k, y, ldy);
      });
    }
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// fp32 x rounded as it is read: the same bits as cast() then gemv.
TEST_F(CudaGemv, Fp32InputEqualsCastThenGemv) {
  for (Elem e : {Elem::kBF16, Elem::kF16}) {
    const int64_t m = 2, n = 50, k = 4096;
    const std::vector<float> x = testing::random_normal(size_t(m * k), 5, 2.0f);
    const std::vector<uint16_t> w = narrow(testing::random_normal(size_t(n * k), 6, 0.05f), e);
    auto d_x = DeviceBuffer<float>::upload(x);
    auto d_w = DeviceBuffer<uint16_t>::upload(w);
    DeviceBuffer<uint16_t> d_xn(size_t(m * k));
    DeviceBuffer<float> y1(size_t(m * n)), y2(size_t(m * n));
    gemv_f32_input(d_x.data(), d_w.data(), e, m, n, k, y1.data(), n, false, nullptr);
    cast(d_x.data(), m * k, d_xn.data(), e, nullptr);
    gemv(d_xn.data(), d_w.data(), e, m, n, k, y2.data(), n, false, nullptr);
    TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(y1.download(), y2.download());
  }
}

// The gate/up GEMV with the activation equals gemv into [m, 2 inter] then gated_activation,
// bit for bit, with and without biases, SiLU and GELU-tanh.
TEST_F(CudaGemv, GatedEqualsGemvThenActivation) {
  for (Elem e : {Elem::kBF16, Elem::kF16}) {
    for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
      for (bool biases : {false, true}) {
        const int64_t m = 3, inter = 45, k = 1024;
        const std::vector<uint16_t> x = narrow(testing::random_normal(size_t(m * k), 7), e);
        const std::vector<uint16_t> w =
            narrow(testing::random_normal(size_t(2 * inter * k), 8, 0.05f), e);
        auto d_x = DeviceBuffer<uint16_t>::upload(x);
        auto d_w = DeviceBuffer<uint16_t>::upload(w);
        auto gb = DeviceBuffer<float>::upload(testing::random_normal(size_t(inter), 9, 0.3f));
        auto ub = DeviceBuffer<float>::upload(testing::random_normal(size_t(inter), 10, 0.3f));
        const float* gbp = biases ? gb.data() : nullptr;
        const float* ubp = biases ? ub.data() : nullptr;
        DeviceBuffer<uint16_t> fused(size_t(m * inter)), plain(size_t(m * inter));
        DeviceBuffer<float> gate_up(size_t(m * 2 * inter));
        gemv_gated(d_x.data(), d_w.data(), e, m, inter, k, gbp, ubp, act, fused.data(), nullptr);
        gemv(d_x.data(), d_w.data(), e, m, 2 * inter, k, gate_up.data(), 2 * inter, false,
             nullptr);
        gated_activation(gate_up.data(), m, inter, gbp, ubp, act, plain.data(), e, nullptr);
        TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(fused.download(), plain.download()) << int(e) << " " << int(act) << biases;
      }
    }
  }
}

TEST(CudaGemvArgs, RejectsWhatItCannotTake) {
  alignas(16) static uint16_t buffer[64];
  EXPECT_FALSE(gemv_supported(buffer, buffer, Elem::kF32, 1, 8));
  EXPECT_FALSE(gemv_supported(buffer, buffer, Elem::kBF16, 9, 8));
  EXPECT_FALSE(gemv_supported(buffer, buffer, Elem::kBF16, 1, 12));
  EXPECT_FALSE(gemv_supported(buffer + 1, buffer, Elem::kBF16, 1, 8));
  EXPECT_TRUE(gemv_supported(buffer, buffer, Elem::kBF16, 8, 16));
  EXPECT_THROW(gemv(buffer, buffer, Elem::kBF16, 0, 4, 8, nullptr, 4, false, nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace turbokv::cuda
