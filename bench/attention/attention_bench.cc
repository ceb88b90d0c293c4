// Attention kernels in perf mode (STYLE habit 2): decode (1 query) and prefill (a chunk of
// 128 queries at the end of the context) over every cache type, 32 query / 8 KV heads,
// d = 128. Reports time and the cache bytes read per second. Not a test: never gates CI.
//   build/bench/attention/attention_bench --benchmark_filter=decode
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "core/threads.h"
#include "kv/dense_kv_cache.h"
#include "kv/turboquant_kv_cache.h"
#include "kv/uniform_kv_cache.h"

namespace turbokv {
namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;

enum CacheKind { kDenseF32, kDenseF16, kTurboQuant35, kUniform4 };

std::unique_ptr<KVCache> make_cache(CacheKind kind) {
  switch (kind) {
    case kDenseF32:
      return std::make_unique<DenseKVCache>(kKvHeads, kHeadDim, KVDType::kF32);
    case kDenseF16:
      return std::make_unique<DenseKVCache>(kKvHeads, kHeadDim, KVDType::kF16);
    case kTurboQuant35:
      return std::make_unique<TurboQuantKVCache>(kKvHeads, kHeadDim,
                                                 TurboQuantKVConfig{3, 4, 0, true});
    case kUniform4:
      return std::make_unique<UniformKVCache>(kKvHeads, kHeadDim, UniformKVConfig{4, 4, 64});
  }
  return nullptr;
}

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(gen);
  return x;
}

// Args: cache kind, context, queries.
void BM_attention(benchmark::State& state) {
  const auto kind = static_cast<CacheKind>(state.range(0));
  const int64_t context = state.range(1);
  const int n_q = static_cast<int>(state.range(2));
  set_num_threads(2);
  auto cache = make_cache(kind);
  const size_t row = size_t(kKvHeads) * kHeadDim;
  const auto k = random_vector(context * row, 1);
  const auto v = random_vector(context * row, 2);
  cache->append(k.data(), v.data(), static_cast<int>(context));
  const auto q = random_vector(size_t(n_q) * kHeads * kHeadDim, 3);
  std::vector<float> out(q.size());
  const AttentionParams params{kHeads, 1.0f / std::sqrt(float(kHeadDim)), 0, 0};
  for (auto _ : state) {
    cache->attend(q.data(), n_q, params, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(cache->nbytes()));
  state.SetLabel(cache->type_name());
}

void decode_and_prefill(benchmark::internal::Benchmark* b) {
  for (int kind : {kDenseF32, kDenseF16, kTurboQuant35, kUniform4}) {
    for (int64_t context : {1024, 4096, 16384}) b->Args({kind, context, 1});
    b->Args({kind, 2048, 128});
  }
}

BENCHMARK(BM_attention)->Apply(decode_and_prefill)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace turbokv

BENCHMARK_MAIN();
