// `turbokv bench <mode>`: benchmarks that print both sides measured in one run and the ratio.
// Modes are CLI11 subcommands; `attention` lives here (decode attention: dense f16 vs the
// quantized caches). Other modes (`e2e`, `prefix`) add their own subcommands next to it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/bench_e2e.h"
#include "cli/bench_prefix.h"
#include "cli/bench_memory.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/threads.h"
#include "kv/dense_kv_cache.h"
#include "kv/turboquant_kv_cache.h"
#include "kv/uniform_kv_cache.h"

namespace turbokv::cli {
namespace {

struct AttentionBenchFlags {
  std::string device = "cpu";
  std::string contexts = "1024,4096,16384,65536";
  int threads = 2;
  int repeats = 0;  // 0: chosen per context
  bool json = false;
};

std::vector<int64_t> parse_contexts(const std::string& text) {
  std::vector<int64_t> contexts;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 1 || value > (1 << 24)) {
      throw InvalidArgument(str_cat("--contexts: '", item,
                                    "' is not a context length in 1..16777216 (a comma-separated "
                                    "list like 1024,4096)"));
    }
    contexts.push_back(value);
  }
  return contexts;
}

// Fills a cache with `context` random tokens, appended in chunks as a prefill would.
void fill(KVCache& cache, int64_t context, uint32_t seed) {
  constexpr int64_t kChunk = 4096;
  const int64_t row = int64_t(cache.kv_heads()) * cache.head_dim();
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(kChunk * row), v(kChunk * row);
  for (int64_t done = 0; done < context; done += kChunk) {
    const int64_t n = std::min(kChunk, context - done);
    for (int64_t i = 0; i < n * row; ++i) {
      k[i] = normal(gen);
      v[i] = normal(gen);
    }
    cache.append(k.data(), v.data(), static_cast<int>(n));
  }
}

// The caches compared, each filled with the same tokens.
struct BenchCache {
  const char* name;
  std::unique_ptr<KVCache> cache;
  std::vector<double> us;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int run_attention_bench(const AttentionBenchFlags& flags) {
  if (flags.device != "cpu") {
    throw InvalidArgument(
        str_cat("--device ", flags.device, " is not available in this build; allowed: cpu"));
  }
  if (flags.threads < 1 || flags.threads > 1024) {
    throw InvalidArgument(str_cat("--threads ", flags.threads, " is out of range (1..1024)"));
  }
  if (flags.repeats < 0) throw InvalidArgument(str_cat("--repeats ", flags.repeats, " < 0"));
  const std::vector<int64_t> contexts = parse_contexts(flags.contexts);
  set_num_threads(flags.threads);
  constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;
  const AttentionParams params{kHeads, 1.0f / std::sqrt(float(kHeadDim)), 0.0f, 0};
  std::vector<float> q(kHeads * kHeadDim), out(kHeads * kHeadDim);
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& x : q) x = normal(gen);

  nlohmann::json results = nlohmann::json::array();
  if (!flags.json) {
    std::printf("decode attention: %d query heads, %d KV heads, d=%d, %d threads, median us\n",
                kHeads, kKvHeads, kHeadDim, flags.threads);
    std::printf("%8s %10s %10s %8s %9s %10s %8s\n", "context", "dense_f16", "tq_3.5", "speedup",
                "tq_GB/s", "uniform_4", "speedup");
  }
  for (const int64_t context : contexts) {
    const int repeats = flags.repeats > 0
                            ? flags.repeats
                            : static_cast<int>(std::clamp<int64_t>((1 << 22) / context, 9, 200));
    BenchCache caches[] = {
        {"dense", std::make_unique<DenseKVCache>(kKvHeads, kHeadDim, KVDType::kF16), {}},
        {"turboquant",
         std::make_unique<TurboQuantKVCache>(kKvHeads, kHeadDim, TurboQuantKVConfig{3, 4, 0, true}),
         {}},
        {"uniform",
         std::make_unique<UniformKVCache>(kKvHeads, kHeadDim, UniformKVConfig{4, 4, 64}),
         {}},
    };
    for (auto& c : caches) {
      fill(*c.cache, context, 1);
      c.cache->attend(q.data(), 1, params, out.data());  // warm-up
    }
    // Interleaved, so load from other processes hits all sides alike.
    for (int i = 0; i < repeats; ++i) {
      for (auto& c : caches) {
        const auto start = std::chrono::steady_clock::now();
        c.cache->attend(q.data(), 1, params, out.data());
        c.us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count());
      }
    }
    const double dense_us = median(caches[0].us);
    const double quant_us = median(caches[1].us);
    const double uniform_us = median(caches[2].us);
    nlohmann::json r = {{"context", context},
                        {"dense_us", dense_us},
                        {"quant_us", quant_us},
                        {"speedup", dense_us / quant_us},
                        {"quant_gbps", caches[1].cache->nbytes() / quant_us / 1e3},
                        {"dense_gbps", caches[0].cache->nbytes() / dense_us / 1e3},
                        {"uniform_us", uniform_us},
                        {"uniform_speedup", dense_us / uniform_us},
                        {"uniform_gbps", caches[2].cache->nbytes() / uniform_us / 1e3},
                        {"dense_bytes", caches[0].cache->nbytes()},
                        {"quant_bytes", caches[1].cache->nbytes()},
                        {"uniform_bytes", caches[2].cache->nbytes()},
                        {"repeats", repeats}};
    results.push_back(r);
    if (!flags.json) {
      std::printf("%8lld %10.1f %10.1f %7.2fx %9.1f %10.1f %7.2fx\n",
                  static_cast<long long>(context), dense_us, quant_us, dense_us / quant_us,
                  r["quant_gbps"].get<double>(), uniform_us, dense_us / uniform_us);
    }
  }
  if (flags.json) {
    nlohmann::json doc = {{"device", flags.device},
                          {"threads", flags.threads},
                          {"heads", kHeads},
                          {"kv_heads", kKvHeads},
                          {"head_dim", kHeadDim},
                          {"quant", "turboquant K3/V4 (3.5)"},
                          {"uniform", "uniform 4-bit g64"},
                          {"results", results}};
    std::printf("%s\n", doc.dump().c_str());
  }
  return 0;
}

int bench_main(int argc, char** argv) {
  CLI::App app("benchmarks: both sides measured in one run, and the ratio", "bench");
  app.require_subcommand(1);
  AttentionBenchFlags attention;
  CLI::App* attention_cmd =
      app.add_subcommand("attention", "decode attention: dense f16 vs TurboQuant 3.5 vs uniform 4");
  attention_cmd->add_option("--device", attention.device, "cpu (cuda: not in this build)");
  attention_cmd->add_option("--contexts", attention.contexts, "comma-separated context lengths");
  attention_cmd->add_option("--threads", attention.threads, "worker threads")
      ->check(integer_in(0, 1024));
  attention_cmd->add_option("--repeats", attention.repeats, "timed runs per kernel (median)")
      ->check(integer_in(0, 1 << 20));
  attention_cmd->add_flag("--json", attention.json, "print one JSON object");
  E2EBenchFlags e2e;
  CLI::App* e2e_cmd = add_e2e_bench(app, e2e);
  PrefixBenchFlags prefix;
  CLI::App* prefix_cmd = add_prefix_bench(app, prefix);
  MemoryBenchFlags memory;
  CLI::App* memory_cmd = add_memory_bench(app, memory);
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (attention_cmd->parsed()) return run_attention_bench(attention);
  if (e2e_cmd->parsed()) return run_e2e_bench(e2e);
  if (prefix_cmd->parsed()) return run_prefix_bench(prefix);
  if (memory_cmd->parsed()) return run_memory_bench(memory);
  return 2;
}

}  // namespace

TURBOKV_COMMAND("bench", "benchmarks (attention, e2e, prefix, memory)", bench_main);

}  // namespace turbokv::cli
