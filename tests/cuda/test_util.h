// Helpers of the CUDA tests: the skip-without-GPU fixture, random data, and the slow obvious
// CPU reference attention (double precision) every CUDA attention kernel is compared with.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda::testing {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device on this machine";
  }
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
