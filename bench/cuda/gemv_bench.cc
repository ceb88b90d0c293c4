// Decode products on bf16 weights: our GEMV (kernels/cuda/gemv.h) against cuBLAS's
// cublasGemmEx on the same matrices, timed in one run on one GPU, for the fused projections of
// the attn4 and Llama-3-8B shapes (scripts/make_shape_model.py): microseconds per product, GB/s
// of weights read and the cuBLAS / GEMV time ratio. Each measurement is a CUDA graph of `reps`
// products cycling over copies of the matrix that together exceed the L2 cache (weights come
// from HBM, as in a decode step); the best of 5 graph launches is reported.
//
//   build/bench/cuda/gemv_bench [--m 1..8] [--reps 40]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemv.h"

namespace {

using namespace turbokv;
using namespace turbokv::cuda;

struct Shape {
  const char* model;
  const char* name;
  int64_t rows, cols;
  int per_model;  // per token: layers, or 1 LM head
};
const Shape kShapes[] = {
    {"attn4", "qkv", 6144, 4096, 4},       {"attn4", "o", 4096, 4096, 4},
    {"attn4", "gate_up", 2048, 4096, 4},   {"attn4", "down", 4096, 1024, 4},
    {"attn4", "lm_head", 8192, 4096, 1},   {"llama3-8b", "qkv", 6144, 4096, 32},
    {"llama3-8b", "o", 4096, 4096, 32},    {"llama3-8b", "gate_up", 28672, 4096, 32},
    {"llama3-8b", "down", 4096, 14336, 32}, {"llama3-8b", "lm_head", 128256, 4096, 1}};

constexpr size_t kColdBytes = size_t(256) << 20;  // > the 50 MB L2 of an H100/H200

void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(str_cat(what, " failed: ", cublasGetStatusString(status)));
  }
}

// Microseconds per call of `call(copy)` for calls cycling over `copies`, from a graph.
double per_call_us(cudaStream_t stream, const std::function<void(int)>& call, int copies,
                   int reps) {
  call(0);
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  TURBOKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) call(i % copies);
  TURBOKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  TURBOKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TURBOKV_CUDA_CHECK(cudaGraphDestroy(graph));
  cudaEvent_t start, stop;
  TURBOKV_CUDA_CHECK(cudaEventCreate(&start));
  TURBOKV_CUDA_CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int t = 0; t < 6; ++t) {
    TURBOKV_CUDA_CHECK(cudaEventRecord(start, stream));
    TURBOKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TURBOKV_CUDA_CHECK(cudaEventRecord(stop, stream));
    TURBOKV_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TURBOKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (t > 0) best = std::min(best, ms);  // launch 0 warms up
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  TURBOKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
  return 1000.0 * best / reps;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "gemv_bench: %s\nusage: gemv_bench [--m 1..%lld] [--reps N]\n",
               why.c_str(), static_cast<long long>(kGemvMaxRows));
  std::exit(2);
}

int run(int64_t m, int reps) {
  if (!device_available()) {
    std::fprintf(stderr, "gemv_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  TURBOKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, m = %lld, reps = %d\n", prop.name, static_cast<long long>(m), reps);
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas;
  check_blas(cublasCreate(&blas), "cublasCreate");
  check_blas(cublasSetStream(blas, stream), "cublasSetStream");
  DeviceBuffer<uint8_t> workspace(size_t(32) << 20);
  check_blas(cublasSetWorkspace(blas, workspace.data(), workspace.bytes()), "cublasSetWorkspace");
  const int64_t max_cols = 14336, max_rows = 128256;
  DeviceBuffer<__nv_bfloat16> x(size_t(m * max_cols));
  TURBOKV_CUDA_CHECK(cudaMemset(x.data(), 0x3C, x.bytes()));
  DeviceBuffer<float> y(size_t(m * max_rows));
  std::printf("%-10s %-8s %7s %10s %9s %10s %9s %8s\n", "model", "matrix", "copies", "cuBLAS us",
              "GB/s", "gemv us", "GB/s", "ratio");
  std::string model;
  double blas_total = 0, gemv_total = 0, bytes_total = 0;
  auto flush_model = [&] {
    if (model.empty()) return;
    std::printf("%-10s %-8s %7s %10.1f %9.0f %10.1f %9.0f %8.2f   (per token)\n", model.c_str(),
                "all", "", blas_total, bytes_total / blas_total * 1e-3, gemv_total,
                bytes_total / gemv_total * 1e-3, blas_total / gemv_total);
    blas_total = gemv_total = bytes_total = 0;
  };
  for (const Shape& s : kShapes) {
    if (model != s.model) {
      flush_model();
      model = s.model;
    }
    const size_t bytes = size_t(s.rows * s.cols * 2);
    const int copies = int(std::clamp<size_t>((kColdBytes + bytes - 1) / bytes, 1, 64));
    std::vector<DeviceBuffer<__nv_bfloat16>> w;
    for (int c = 0; c < copies; ++c) {
      w.emplace_back(size_t(s.rows * s.cols));
      TURBOKV_CUDA_CHECK(cudaMemset(w.back().data(), 0x3C, bytes));  // bf16 ~0.0115
    }
    const float one = 1.0f, zero = 0.0f;
    const double blas_us = per_call_us(
        stream,
        [&](int c) {
          check_blas(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.rows), int(m),
                                  int(s.cols), &one, w[size_t(c)].data(), CUDA_R_16BF,
                                  int(s.cols), x.data(), CUDA_R_16BF, int(s.cols), &zero,
                                  y.data(), CUDA_R_32F, int(s.rows), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
        },
        copies, reps);
    const double gemv_us = per_call_us(
        stream,
        [&](int c) {
          gemv(x.data(), w[size_t(c)].data(), Elem::kBF16, m, s.rows, s.cols, y.data(), s.rows,
               false, stream);
        },
        copies, reps);
    std::printf("%-10s %-8s %7d %10.2f %9.0f %10.2f %9.0f %8.2f\n", s.model, s.name, copies,
                blas_us, bytes / blas_us * 1e-3, gemv_us, bytes / gemv_us * 1e-3,
                blas_us / gemv_us);
    std::fflush(stdout);
    blas_total += blas_us * s.per_model;
    gemv_total += gemv_us * s.per_model;
    bytes_total += double(bytes) * s.per_model;
  }
  flush_model();
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t m = 1;
  int reps = 40;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--m") {
      m = std::atoll(v.c_str());
      if (m < 1 || m > kGemvMaxRows) usage("--m " + v + " is out of range");
    } else if (a == "--reps") {
      reps = std::atoi(v.c_str());
      if (reps < 1) usage("--reps " + v + " must be >= 1");
    } else {
      usage("unknown option " + a);
    }
  }
  try {
    return run(m, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemv_bench: %s\n", e.what());
    return 1;
  }
}
