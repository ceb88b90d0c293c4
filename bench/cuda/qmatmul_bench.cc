// Decode-shaped products on quantized weights (quant_matmul with m activation rows) against
// cuBLAS on bf16 weights of the same shapes, timed in one run on one GPU. Per matrix of a
// Llama-3-8B decoder layer (q, k, v, o, gate, up, down) and its LM head: microseconds per
// product, GB/s of weight bytes read (data plus scales) and the bf16 / quantized time ratio;
// then the whole-model sum (32 layers + LM head). Each measurement is a CUDA graph of `reps`
// products cycling over copies of the matrix that together exceed the L2 cache, so every
// product reads its weights from HBM; the best of 5 graph launches is reported.
//
//   build/bench/cuda/qmatmul_bench [--m 1] [--reps 40] [--formats q4_0,q4_k,mlx4]
//
// formats: q8_0 q4_0 q5_0 q4_k q6_k mlx2 mlx4 mlx8 (MLX: group 64, bf16 scales), and
// mlx4_int8: mlx4 through the int8-activation GEMV (quant_gemv_int8, --m 1 only), once per
// kernel shape (Int8GemvShape; the row names the shape, a * marks the one quant_matmul uses).
// The other formats go through quant_matmul without a scratch, so at m = 1 mlx4 takes the
// fp32 GEMV there (the int8 GEMV needs the scratch for the quantized x).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/qmatmul.h"

namespace {

using namespace turbokv;
using namespace turbokv::cuda;

struct Shape {
  const char* name;
  int64_t rows, cols;
  int per_model;  // how many the model has (32 layers, or 1 LM head)
};
const Shape kShapes[] = {{"q_proj", 4096, 4096, 32},     {"k_proj", 1024, 4096, 32},
                         {"v_proj", 1024, 4096, 32},     {"o_proj", 4096, 4096, 32},
                         {"gate_proj", 14336, 4096, 32}, {"up_proj", 14336, 4096, 32},
                         {"down_proj", 4096, 14336, 32}, {"lm_head", 128256, 4096, 1}};

struct FormatSpec {
  WeightFormat format;
  int bits;
};
const std::map<std::string, FormatSpec> kFormats = {
    {"q8_0", {WeightFormat::kQ8_0, 0}},   {"q4_0", {WeightFormat::kQ4_0, 0}},
    {"q5_0", {WeightFormat::kQ5_0, 0}},   {"q4_k", {WeightFormat::kQ4_K, 0}},
    {"q6_k", {WeightFormat::kQ6_K, 0}},   {"mlx2", {WeightFormat::kAffine, 2}},
    {"mlx4", {WeightFormat::kAffine, 4}}, {"mlx8", {WeightFormat::kAffine, 8}}};

constexpr size_t kColdBytes = size_t(256) << 20;  // > the 50 MB L2 of an H100/H200

void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(str_cat(what, " failed: ", cublasGetStatusString(status)));
  }
}

// Random code bytes; every block scale (or MLX scale and bias) a small finite value.
struct HostMatrix {
  std::vector<uint8_t> data, scales, biases;
  WeightMatrix w;
};
HostMatrix random_matrix(const FormatSpec& f, int64_t rows, int64_t cols) {
  HostMatrix h;
  h.w = WeightMatrix(DType::BF16, nullptr, rows, cols);
  h.w.format = f.format;
  if (f.format == WeightFormat::kAffine) {
    h.w.affine = AffineParams{nullptr, nullptr, DType::BF16, f.bits, 64};
  }
  h.data.resize(size_t(rows * h.w.row_bytes()));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i + 8 <= h.data.size(); i += 8) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::memcpy(h.data.data() + i, &state, 8);
  }
  const uint16_t small = 0x2000;  // f16 2^-7
  if (f.format == WeightFormat::kAffine) {
    h.scales.assign(size_t(rows * cols / 64 * 2), 0x3C);  // bf16 0x3C3C, ~0.0115
    h.biases = h.scales;
    h.w.affine.scales = h.scales.data();
    h.w.affine.biases = h.biases.data();
  } else {
    const BlockGeometry g = block_geometry(f.format);
    const size_t d_at = f.format == WeightFormat::kQ6_K ? 208 : 0;
    for (size_t at = 0; at < h.data.size(); at += size_t(g.bytes)) {
      std::memcpy(h.data.data() + at + d_at, &small, 2);
      if (f.format == WeightFormat::kQ4_K) std::memcpy(h.data.data() + at + 2, &small, 2);
    }
  }
  h.w.data = h.data.data();
  return h;
}

class Timer {
 public:
  explicit Timer(cudaStream_t stream) : stream_(stream) {
    TURBOKV_CUDA_CHECK(cudaEventCreate(&start_));
    TURBOKV_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  // Microseconds per call of `call(copy)` for calls cycling over `copies`, from a graph.
  double per_call_us(const std::function<void(int)>& call, int copies, int reps) {
    call(0);  // outside the graph: one-time setup (kernel attributes)
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudaGraph_t graph;
    TURBOKV_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; ++i) call(i % copies);
    TURBOKV_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec;
    TURBOKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    TURBOKV_CUDA_CHECK(cudaGraphDestroy(graph));
    float best = 1e30f;
    for (int t = 0; t < 6; ++t) {
      TURBOKV_CUDA_CHECK(cudaEventRecord(start_, stream_));
      TURBOKV_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
      TURBOKV_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      TURBOKV_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      TURBOKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      if (t > 0) best = std::min(best, ms);  // launch 0 warms up
    }
    TURBOKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
    return 1000.0 * best / reps;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

int copies_for(size_t bytes) {
  return int(std::clamp<size_t>((kColdBytes + bytes - 1) / bytes, 1, 64));
}

struct Options {
  int64_t m = 1;
  int reps = 40;
  std::vector<std::string> formats = {"q4_0", "q4_k", "mlx4", "q6_k", "q8_0"};
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "qmatmul_bench: %s\nusage: qmatmul_bench [--m 1..%lld] [--reps N] "
               "[--formats q8_0,q4_0,q5_0,q4_k,q6_k,mlx2,mlx4,mlx8]\n",
               why.c_str(), static_cast<long long>(kQuantGemvMaxRows));
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--m") {
      o.m = std::atoll(v.c_str());
      if (o.m < 1 || o.m > kQuantGemvMaxRows)
        usage("--m " + v + " is not in 1.." + std::to_string(kQuantGemvMaxRows));
    } else if (a == "--reps") {
      o.reps = std::atoi(v.c_str());
      if (o.reps < 1) usage("--reps " + v + " must be >= 1");
    } else if (a == "--formats") {
      o.formats.clear();
      std::stringstream list(v);
      for (std::string f; std::getline(list, f, ',');) {
        if (kFormats.count(f) == 0 && f != "mlx4_int8") usage("unknown format " + f);
        o.formats.push_back(f);
      }
    } else {
      usage("unknown option " + a);
    }
  }
  return o;
}

int run(const Options& o) {
  if (!device_available()) {
    std::fprintf(stderr, "qmatmul_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  TURBOKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, m = %lld, reps = %d\n", prop.name, static_cast<long long>(o.m), o.reps);
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas;
  check_blas(cublasCreate(&blas), "cublasCreate");
  check_blas(cublasSetStream(blas, stream), "cublasSetStream");
  DeviceBuffer<uint8_t> workspace(size_t(32) << 20);
  check_blas(cublasSetWorkspace(blas, workspace.data(), workspace.bytes()), "cublasSetWorkspace");
  Timer timer(stream);
  QuantScratch no_scratch;
  DeviceBuffer<uint8_t> int8_workspace(size_t(quant_gemv_int8_workspace_bytes(14336)));

  const int64_t max_cols = 14336, max_rows = 128256;
  DeviceBuffer<float> x(size_t(o.m * max_cols));
  DeviceBuffer<__nv_bfloat16> x_bf16(size_t(o.m * max_cols));
  DeviceBuffer<float> y(size_t(o.m * max_rows));
  x.zero();
  x_bf16.zero();

  std::map<std::string, double> model_us;  // format (or "bf16") -> summed over the model
  std::map<std::string, double> model_bytes;
  std::printf("%-10s %-22s %10s %9s %10s %9s %8s\n", "matrix", "format", "us", "GB/s", "bf16 us",
              "GB/s", "ratio");
  for (const Shape& s : kShapes) {
    const size_t dense_bytes = size_t(s.rows * s.cols * 2);
    const int dense_copies = copies_for(dense_bytes);
    std::vector<DeviceBuffer<__nv_bfloat16>> dense;
    for (int c = 0; c < dense_copies; ++c) {
      dense.emplace_back(size_t(s.rows * s.cols));
      TURBOKV_CUDA_CHECK(cudaMemset(dense.back().data(), 0x3C, dense_bytes));  // bf16 ~0.0115
    }
    const float one = 1.0f, zero = 0.0f;
    const double dense_us = timer.per_call_us(
        [&](int c) {
          check_blas(
              cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.rows), int(o.m), int(s.cols), &one,
                           dense[size_t(c)].data(), CUDA_R_16BF, int(s.cols), x_bf16.data(),
                           CUDA_R_16BF, int(s.cols), &zero, y.data(), CUDA_R_32F, int(s.rows),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
        },
        dense_copies, o.reps);
    dense.clear();
    model_us["bf16"] += dense_us * s.per_model;
    model_bytes["bf16"] += double(dense_bytes) * s.per_model;
    for (const std::string& format : o.formats) {
      const bool int8 = format == "mlx4_int8";
      if (int8 && o.m != 1) continue;
      const HostMatrix host = random_matrix(kFormats.at(int8 ? "mlx4" : format), s.rows, s.cols);
      const size_t bytes = size_t(host.w.total_bytes());
      const int copies = copies_for(bytes);
      std::vector<DeviceQuantMatrix> weights;
      weights.push_back(upload_quant_matrix(host.w));
      for (int c = 1; c < copies; ++c) weights.push_back(upload_quant_matrix(host.w));
      for (int shape = 0; shape < (int8 ? kInt8GemvShapes : 1); ++shape) {
        const auto kernel = Int8GemvShape(shape);
        const std::string name =
            int8 ? str_cat("int8/", int8_gemv_shape_name(kernel),
                           kernel == int8_gemv_shape() ? "*" : "")
                 : format;
        const double us = timer.per_call_us(
            [&](int c) {
              if (int8) {
                quant_gemv_int8(weights[size_t(c)].view, x.data(), y.data(),
                                int8_workspace.data(), stream, kernel);
              } else {
                quant_matmul(weights[size_t(c)], x.data(), o.m, y.data(), s.rows, no_scratch,
                             blas, stream);
              }
            },
            copies, o.reps);
        model_us[name] += us * s.per_model;
        model_bytes[name] += double(bytes) * s.per_model;
        std::printf("%-10s %-22s %10.2f %9.0f %10.2f %9.0f %8.2f\n", s.name,
                    (name + " x" + std::to_string(copies)).c_str(), us, bytes / us * 1e-3,
                    dense_us, dense_bytes / dense_us * 1e-3, dense_us / us);
        std::fflush(stdout);
      }
    }
  }
  std::printf("\nwhole model (32 layers + LM head), weight products only:\n");
  std::printf("%-22s %10s %9s %9s %8s\n", "format", "ms", "GB", "GB/s", "vs bf16");
  for (const auto& [name, us] : model_us) {
    std::printf("%-22s %10.3f %9.2f %9.0f %8.2f\n", name.c_str(), us * 1e-3,
                model_bytes[name] * 1e-9, model_bytes[name] / us * 1e-3, model_us["bf16"] / us);
  }
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qmatmul_bench: %s\n", e.what());
    return 1;
  }
}
