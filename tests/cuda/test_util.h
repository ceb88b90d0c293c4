// Helpers of the CUDA tests: the skip-without-GPU fixture, random data, and the slow obvious
// CPU reference attention (double precision) every CUDA attention kernel is compared with.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <algorithm>

#include "core/half.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"

namespace turbokv::cuda::testing {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

// A paged cache for kernel tests: batch * stride blocks of block_bytes in one zeroed device
// buffer, handed to the sequences' block tables in shuffled order (so no kernel can get away
// with assuming contiguous blocks).
class PagedBlocks {
 public:
  PagedBlocks(int batch, int stride, size_t block_bytes, uint64_t seed)
      : batch_(batch), stride_(stride), block_bytes_(block_bytes),
        memory_(size_t(batch) * stride * block_bytes), order_(size_t(batch) * stride) {
    memory_.zero();
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = int(i);
    std::shuffle(order_.begin(), order_.end(), std::mt19937_64(seed));
    std::vector<uint8_t*> table(order_.size());
    for (size_t i = 0; i < order_.size(); ++i) {
      table[i] = memory_.data() + size_t(order_[i]) * block_bytes;
    }
    table_ = DeviceBuffer<uint8_t*>::upload(table);
  }
  uint8_t* const* table() const { return table_.data(); }
  int stride() const { return stride_; }
  // Sequence b's blocks in table order: [stride][block_bytes].
  std::vector<uint8_t> download_sequence(int b) const {
    const std::vector<uint8_t> all = memory_.download();
    std::vector<uint8_t> out;
    for (int i = 0; i < stride_; ++i) {
      const uint8_t* block = all.data() + size_t(order_[size_t(b) * stride_ + i]) * block_bytes_;
      out.insert(out.end(), block, block + block_bytes_);
    }
    return out;
  }
  // Writes sequence b's blocks from [stride][block_bytes] host bytes.
  void upload_sequence(int b, const std::vector<uint8_t>& blocks) {
    for (int i = 0; i < stride_; ++i) {
      TURBOKV_CUDA_CHECK(cudaMemcpy(
          memory_.data() + size_t(order_[size_t(b) * stride_ + i]) * block_bytes_,
          blocks.data() + size_t(i) * block_bytes_, block_bytes_, cudaMemcpyHostToDevice));
    }
  }

 private:
  int batch_, stride_;
  size_t block_bytes_;
  DeviceBuffer<uint8_t> memory_;
  std::vector<int> order_;
  DeviceBuffer<uint8_t*> table_;
};

inline std::vector<float> random_normal(size_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

inline std::vector<float> round_to_f16(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f16_to_f32(f32_to_f16(x[i]));
  return out;
}

// Causal GQA attention in double. keys/values(b, t, h) -> pointer to 128 floats.
//   q, out [batch, n_q, n_heads, d]; query i of sequence b sits at position len[b] - n_q + i.
template <typename KeyFn, typename ValueFn>
std::vector<float> reference_attention(const std::vector<float>& q, const std::vector<int>& lens,
                                       int n_q, int n_heads, int kv_heads, int d, double scale,
                                       KeyFn key, ValueFn value) {
  const int batch = int(lens.size());
  const int group = n_heads / kv_heads;
  std::vector<float> out(q.size());
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < n_q; ++i) {
      const int visible = lens[b] - n_q + i + 1;
      for (int hq = 0; hq < n_heads; ++hq) {
        const float* qv = &q[((size_t(b) * n_q + i) * n_heads + hq) * d];
        std::vector<double> s(visible);
        double m = -INFINITY;
        for (int t = 0; t < visible; ++t) {
          const float* k = key(b, t, hq / group);
          double dot = 0;
          for (int j = 0; j < d; ++j) dot += double(qv[j]) * k[j];
          s[t] = scale * dot;
          m = std::max(m, s[t]);
        }
        double l = 0;
        std::vector<double> o(d, 0.0);
        for (int t = 0; t < visible; ++t) {
          const double p = std::exp(s[t] - m);
          l += p;
          const float* v = value(b, t, hq / group);
          for (int j = 0; j < d; ++j) o[j] += p * v[j];
        }
        float* dst = &out[((size_t(b) * n_q + i) * n_heads + hq) * d];
        for (int j = 0; j < d; ++j) dst[j] = float(o[j] / l);
      }
    }
  }
  return out;
}

// Largest over rows of |out_row - ref_row| / |ref_row| (rows of d floats); NaN if any NaN.
inline double max_row_relative_error(const std::vector<float>& out, const std::vector<float>& ref,
                                     int d) {
  double worst = 0;
  for (size_t r = 0; r + d <= ref.size(); r += d) {
    double diff = 0, norm = 0;
    for (int j = 0; j < d; ++j) {
      if (std::isnan(out[r + j])) return NAN;
      diff += (double(out[r + j]) - ref[r + j]) * (double(out[r + j]) - ref[r + j]);
      norm += double(ref[r + j]) * ref[r + j];
    }
    worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
  }
  return worst;
}

}  // namespace turbokv::cuda::testing
