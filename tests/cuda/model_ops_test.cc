// Fused model kernels against the CPU reference and against the unfused kernels they replace:
// residual_add_norm = residual_add then rms_norm (bit for bit), its norm equal to
// kernels/cpu rms_norm_ref up to float rounding.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/norm.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/model_ops.h"
#include "test_util.h"

namespace turbokv::cuda {
namespace {

using testing::CudaTest;

class CudaModelOps : public CudaTest {};

// dim 4136: the vector path (one block per row, values in registers); 1001: the scalar one.
TEST_F(CudaModelOps, ResidualAddNormEqualsResidualThenNorm) {
  for (const int64_t dim : {int64_t(4096 + 40), int64_t(1001)}) {
  SCOPED_TRACE(dim);
  const int64_t rows = 3;
  const std::vector<float> x0 = testing::random_normal(size_t(rows * dim), 1, 3.0f);
  const std::vector<float> y = testing::random_normal(size_t(rows * dim), 2, 0.5f);
  const std::vector<float> bias = testing::random_normal(size_t(dim), 3, 0.1f);
  const std::vector<float> w = testing::random_normal(size_t(dim), 4, 1.0f);
  auto d_y = DeviceBuffer<float>::upload(y);
  auto d_bias = DeviceBuffer<float>::upload(bias);
  auto d_w = DeviceBuffer<float>::upload(w);
  for (Elem e : {Elem::kF32, Elem::kBF16, Elem::kF16}) {
    SCOPED_TRACE(int(e));
    auto x_fused = DeviceBuffer<float>::upload(x0);
    auto x_plain = DeviceBuffer<float>::upload(x0);
    DeviceBuffer<uint8_t> out_fused(size_t(rows * dim) * 4), out_plain(size_t(rows * dim) * 4);
    out_fused.zero();
    out_plain.zero();
    residual_add_norm(x_fused.data(), d_y.data(), rows, dim, d_bias.data(), d_w.data(), 1e-5f,
                      out_fused.data(), e, nullptr);
    residual_add(x_plain.data(), d_y.data(), rows, dim, d_bias.data(), nullptr, 1e-5f, nullptr);
    rms_norm(x_plain.data(), rows, dim, d_w.data(), 1e-5f, out_plain.data(), e, nullptr);
    TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(x_fused.download(), x_plain.download());
    EXPECT_EQ(out_fused.download(), out_plain.download());
    if (e == Elem::kF32) {
      const std::vector<float> x = x_fused.download();
      std::vector<float> want(x.size());
      rms_norm_ref(x.data(), rows, dim, w.data(), 1e-5f, want.data());
      const std::vector<uint8_t> bytes = out_fused.download();
      for (size_t i = 0; i < want.size(); ++i) {
        float got;
        std::memcpy(&got, bytes.data() + 4 * i, 4);
        ASSERT_NEAR(got, want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << i;
      }
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(x[i], x0[i] + (y[i] + bias[i % size_t(dim)])) << i;
      }
    }
  }
  }
}

// embed_rows and gather_rows against the host rows they copy.
TEST_F(CudaModelOps, EmbedAndGatherCopyTheirRows) {
  const int64_t vocab = 50, cols = 4096;
  const std::vector<float> table = testing::random_normal(size_t(vocab * cols), 9);
  const std::vector<int32_t> ids = {7, 0, 49, 7};
  auto d_table = DeviceBuffer<float>::upload(table);
  auto d_ids = DeviceBuffer<int32_t>::upload(ids);
  DeviceBuffer<float> emb(ids.size() * cols), gathered(ids.size() * cols);
  embed_rows(d_table.data(), Elem::kF32, cols, d_ids.data(), int64_t(ids.size()), 2.0f,
             emb.data(), nullptr);
  gather_rows(d_table.data(), cols, d_ids.data(), int64_t(ids.size()), gathered.data(), nullptr);
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> e = emb.download(), g = gathered.download();
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float want = table[size_t(ids[r] * cols + c)];
      ASSERT_EQ(e[r * cols + c], 2.0f * want);
      ASSERT_EQ(g[r * cols + c], want);
    }
  }
}

}  // namespace
}  // namespace turbokv::cuda
