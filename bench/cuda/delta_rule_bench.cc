// Prefill of one Gated DeltaNet layer's delta rule on the GPU (kernels/cuda/linear_attention.h):
// the chunked kernel against the token-by-token recurrence on the same inputs and state, timed
// in one run on one GPU, at the Qwen3.5-4B linear-attention shape (16 key heads, 32 value heads,
// dk = dv = 128) for several prompt lengths: milliseconds per call (best of 5, CUDA events), the
// recurrence / chunked ratio, and the largest difference between the two outputs.
//
//   build/bench/cuda/delta_rule_bench [--tokens 512,2048,8192]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/linear_attention.h"

namespace {

using namespace turbokv;
using namespace turbokv::cuda;

double best_ms(cudaStream_t stream, const std::function<void()>& call) {
  cudaEvent_t start, stop;
  TURBOKV_CUDA_CHECK(cudaEventCreate(&start));
  TURBOKV_CUDA_CHECK(cudaEventCreate(&stop));
  call();  // warm-up (and the chunked kernel's shared-memory attribute)
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    TURBOKV_CUDA_CHECK(cudaEventRecord(start, stream));
    call();
    TURBOKV_CUDA_CHECK(cudaEventRecord(stop, stream));
    TURBOKV_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TURBOKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, double(ms));
  }
  TURBOKV_CUDA_CHECK(cudaEventDestroy(start));
  TURBOKV_CUDA_CHECK(cudaEventDestroy(stop));
  return best;
}

int run(const std::vector<int64_t>& lengths) {
  const GatedDeltaDims dims{16, 32, 128, 128};
  const int64_t key_dim = int64_t(dims.key_heads) * dims.k_dim;
  const int64_t width = 2 * key_dim + int64_t(dims.value_heads) * dims.v_dim;
  const int64_t Hv = dims.value_heads, dv = dims.v_dim;
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("delta rule prefill, Qwen3.5-4B linear-attention shape (Hk 16, Hv 32, dk = dv = "
              "128)\n");
  std::printf("%8s %14s %12s %8s %12s\n", "tokens", "recurrent ms", "chunked ms", "ratio",
              "max |diff|");
  for (int64_t T : lengths) {
    std::mt19937_64 rng{uint64_t(T)};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> qkv(size_t(T * width)), g(size_t(T * Hv)), beta(g.size());
    for (float& v : qkv) v = normal(rng);
    // Unit q and k (q scaled by dk^-1/2), decays in (0, 1), beta in (0, 1): what
    // gated_delta_prepare leaves.
    for (int64_t t = 0; t < T; ++t) {
      for (int h = 0; h < 2 * dims.key_heads; ++h) {
        float* x = qkv.data() + t * width + int64_t(h) * dims.k_dim;
        float s = 0;
        for (int i = 0; i < dims.k_dim; ++i) s += x[i] * x[i];
        const float inv = 1.0f / std::sqrt(s + 1e-6f) *
                          (h < dims.key_heads ? 1.0f / std::sqrt(float(dims.k_dim)) : 1.0f);
        for (int i = 0; i < dims.k_dim; ++i) x[i] *= inv;
      }
    }
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = -0.05f * std::abs(normal(rng));
      beta[i] = 1.0f / (1.0f + std::exp(-normal(rng)));
    }
    DeviceBuffer<float> d_qkv = DeviceBuffer<float>::upload(qkv);
    DeviceBuffer<float> d_g = DeviceBuffer<float>::upload(g);
    DeviceBuffer<float> d_beta = DeviceBuffer<float>::upload(beta);
    DeviceBuffer<float> state(size_t(Hv) * dims.k_dim * dv), out_r(size_t(T * Hv * dv)),
        out_c(out_r.size());
    GatedDeltaRows in;
    in.q = d_qkv.data();
    in.k = in.q + key_dim;
    in.v = in.q + 2 * key_dim;
    in.qk_stride = in.v_stride = width;
    in.g = d_g.data();
    in.beta = d_beta.data();
    in.T = T;
    // Each call starts from a zero state, so both kernels see the same inputs.
    const double rec = best_ms(stream, [&] {
      TURBOKV_CUDA_CHECK(cudaMemsetAsync(state.data(), 0, state.bytes(), stream));
      gated_delta_recurrent(in, dims, state.data(), out_r.data(), stream);
    });
    const double chk = best_ms(stream, [&] {
      TURBOKV_CUDA_CHECK(cudaMemsetAsync(state.data(), 0, state.bytes(), stream));
      gated_delta_chunked(in, dims, state.data(), out_c.data(), stream);
    });
    const std::vector<float> a = out_r.download(), b = out_c.download();
    double diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, double(std::abs(a[i] - b[i])));
    std::printf("%8lld %14.3f %12.3f %7.2fx %12.3g\n", static_cast<long long>(T), rec, chk,
                rec / chk, diff);
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths = {512, 2048, 8192};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tokens" && i + 1 < argc) {
      lengths.clear();
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) lengths.push_back(std::stoll(item));
    } else {
      std::fprintf(stderr, "usage: delta_rule_bench [--tokens 512,2048,8192]\n");
      return 2;
    }
  }
  if (!device_available()) {
    std::fprintf(stderr, "delta_rule_bench: no CUDA device on this machine\n");
    return 2;
  }
  try {
    return run(lengths);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "delta_rule_bench: %s\n", e.what());
    return 1;
  }
}
