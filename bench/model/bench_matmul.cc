// matmul on tinycode-llama's shapes (bf16 weights [1408, 512], the MLP's gate/up), decode (1 row)
// and prefill (512 rows): the fast path and the scalar reference in one run, with GFLOP/s and
// weight GB/s counters. Run: ./build/bench/model/bench_matmul [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/half.h"
#include "core/threads.h"
#include "kernels/cpu/matmul.h"

namespace turbokv {
namespace {

constexpr int64_t kRows = 1408, kCols = 512;

struct Inputs {
  std::vector<uint16_t> weights;  // [kRows, kCols] bf16
  std::vector<float> x, y;        // [m, kCols], [m, kRows]
  WeightMatrix w;
  explicit Inputs(int64_t m) : weights(kRows * kCols), x(size_t(m * kCols)), y(size_t(m * kRows)) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint16_t& v : weights) v = f32_to_bf16(normal(rng));
    for (float& v : x) v = normal(rng);
    w = WeightMatrix{DType::BF16, reinterpret_cast<const uint8_t*>(weights.data()), kRows, kCols};
  }
};

template <auto Fn>
void run(benchmark::State& state) {
  const int64_t m = state.range(0);
  set_num_threads(int(state.range(1)));
  Inputs in(m);
  for (auto _ : state) {
    Fn(in.x.data(), m, in.w, nullptr, in.y.data());
    benchmark::DoNotOptimize(in.y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(double(2 * m * kRows * kCols) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["weight_GB/s"] =
      benchmark::Counter(double(2 * kRows * kCols) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

BENCHMARK(run<matmul>)->Name("matmul")->ArgsProduct({{1, 512}, {1, 2}})->UseRealTime();
BENCHMARK(run<matmul_ref>)->Name("matmul_ref")->ArgsProduct({{1, 32}, {1}})->UseRealTime();

}  // namespace
}  // namespace turbokv

BENCHMARK_MAIN();
