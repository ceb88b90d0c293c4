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
#include <utility>
#include <vector>

#include "cli/bench_e2e.h"
#include "cli/bench_memory.h"
#include "cli/bench_prefix.h"
#include "cli/command.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/threads.h"
#include "kv/cache_policy.h"
#include "kv/dense_kv_cache.h"
#include "kv/kv_resolve.h"
#include "kv/turboquant_kv_cache.h"
#include "kv/uniform_kv_cache.h"

namespace turbokv::cli {
namespace {

struct AttentionBenchFlags {
  std::string device = "cpu";
  std::string contexts = "1024,4096,16384,65536";
  std::string turboquant_bits = "3.5,4/3";  // layer 0 and the later layers of --kv-bits 3.5
  std::string isa = "best";
  std::string products;  // TurboQuant codebook products to compare; empty: the current one
  int threads = 2;
  int repeats = 0;  // 0: chosen per context
  bool json = false;
};

// "int8,exact" -> the products, in order; empty text -> the current setting alone.
std::vector<CodeProducts> parse_products(const std::string& text) {
  if (text.empty()) return {code_products()};
  std::vector<CodeProducts> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item == "int8") {
      out.push_back(CodeProducts::kInt8);
    } else if (item == "exact") {
      out.push_back(CodeProducts::kExact);
    } else {
      throw InvalidArgument(str_cat("--products: '", item, "' is not int8 or exact"), "--products");
    }
  }
  if (out.empty()) throw InvalidArgument("--products: empty list", "--products");
  return out;
}

const char* products_name(CodeProducts p) { return p == CodeProducts::kInt8 ? "int8" : "exact"; }

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

// "tq_<item>", with the key and value bits when the item does not spell them: "tq_3.5=K3/V4".
std::string turboquant_cache_name(const std::string& item, const TurboQuantKVConfig& config) {
  if (item.find('/') != std::string::npos || config.key_bits == config.value_bits) {
    return "tq_" + item;
  }
  auto bits = [](double b) {
    char text[16];
    std::snprintf(text, sizeof(text), "%g", b);
    return std::string(text);
  };
  return str_cat("tq_", item, "=K", bits(config.key_bits), "/V", bits(config.value_bits));
}

// "3.5,4,4/3" -> the TurboQuant cache configurations of --kv-bits 3.5 and 4 (keys floor, values
// ceil, as resolve_kv_options selects them, with its default levers) and of keys 4 / values 3
// (the layers after the first of the default 3.5 split), named as turboquant_cache_name gives
// them, each followed by "<name>_plain", the same bits with every lever off, when the defaults
// turn any on.
std::vector<std::pair<std::string, TurboQuantKVConfig>> parse_turboquant_bits(
    const std::string& text) {
  std::vector<std::pair<std::string, TurboQuantKVConfig>> configs;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    KVOptions options;
    const size_t slash = item.find('/');  // "K/V": explicit key and value bits
    if (slash == std::string::npos) {
      options.kv_bits = parse_kv_bits(item, "--turboquant-bits");
    } else {
      options.kv_key_bits = parse_kv_bits(item.substr(0, slash), "--turboquant-bits");
      options.kv_value_bits = parse_kv_bits(item.substr(slash + 1), "--turboquant-bits");
    }
    options.kv_quant_scheme = "turboquant";
    const TurboQuantKVConfig defaults = turboquant_config(resolve_kv_options(options));
    configs.emplace_back(turboquant_cache_name(item, defaults), defaults);
    TurboQuantKVConfig plain{defaults.key_bits, defaults.value_bits, defaults.seed,
                             defaults.norm_correction};
    if (defaults.center_keys || defaults.center_values || defaults.sink_tokens > 0) {
      configs.emplace_back(turboquant_cache_name(item, defaults) + "_plain", plain);
    }
  }
  if (configs.empty()) throw InvalidArgument("--turboquant-bits: give at least one bit width");
  return configs;
}

AttentionIsa parse_isa(const std::string& name) {
  if (name == "best") return best_attention_isa();
  for (AttentionIsa isa : {AttentionIsa::kScalar, AttentionIsa::kAvx2, AttentionIsa::kAvx512}) {
    if (name == attention_isa_name(isa)) return isa;
  }
  throw InvalidArgument(
      str_cat("--isa ", name, " is not an instruction set; allowed: best, avx512, avx2, scalar"));
}

// The ISA a kernel asked for `isa` runs on this CPU (attention.h falls back downwards).
AttentionIsa usable_isa(AttentionIsa isa) {
  if (isa == AttentionIsa::kAvx512 && !cpu_has_avx512()) isa = AttentionIsa::kAvx2;
  if (isa == AttentionIsa::kAvx2 && !cpu_has_avx2()) isa = AttentionIsa::kScalar;
  return isa;
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

// One side of the comparison: a cache filled with the same tokens as the others, and the
// decode attention of its kernel on the chosen ISA.
struct BenchCache {
  std::string name;
  std::unique_ptr<KVCache> cache;
  std::vector<double> us;
  CodeProducts products = code_products();  // TurboQuant's codebook products

  void attend(const float* q, const AttentionParams& params, float* out, AttentionIsa isa) const {
    const AttentionQueries queries{q, 1, cache->size() - 1};
    set_code_products(products);
    if (const auto* dense = dynamic_cast<const DenseKVCache*>(cache.get())) {
      attention_dense(dense->view(), queries, params, out, isa);
    } else if (const auto* tq = dynamic_cast<const TurboQuantKVCache*>(cache.get())) {
      if (tq->config().center_values || tq->config().sink_tokens > 0) {
        tq->attend(q, 1, params, out);  // the levers' extra steps, kernels on the best ISA
      } else {
        attention_turboquant(tq->view(), queries, params, out, isa);
      }
    } else {
      attention_uniform(dynamic_cast<const UniformKVCache&>(*cache).view(), queries, params, out,
                        isa);
    }
  }
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double minimum(const std::vector<double>& values) {
  return *std::min_element(values.begin(), values.end());
}

// The machine's streaming read bandwidth with the benchmark's threads: one pass summing a
// buffer four times the size of the last-level caches here (256 MiB), in microseconds.
class ReadBandwidth {
 public:
  ReadBandwidth() : data_(kBytes / sizeof(uint64_t), 1) {}
  static constexpr size_t kBytes = size_t(256) << 20;

  double time_us() {
    const auto start = std::chrono::steady_clock::now();
    const int64_t n = static_cast<int64_t>(data_.size());
    std::vector<uint64_t> sums(num_threads() * 8, 0);
    parallel_for(n, n / num_threads(), [&](int64_t begin, int64_t end) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        s0 += data_[i];
        s1 += data_[i + 1];
        s2 += data_[i + 2];
        s3 += data_[i + 3];
      }
      for (; i < end; ++i) s0 += data_[i];
      sums[(begin * num_threads() / n) * 8] = s0 + s1 + s2 + s3;
    });
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    for (uint64_t s : sums) checksum_ += s;
    return us;
  }
  uint64_t checksum() const { return checksum_; }

 private:
  std::vector<uint64_t> data_;
  uint64_t checksum_ = 0;
};

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
  const auto turboquant = parse_turboquant_bits(flags.turboquant_bits);
  const AttentionIsa isa = usable_isa(parse_isa(flags.isa));
  const std::vector<CodeProducts> products = parse_products(flags.products);
  const CodeProducts products_before = code_products();
  set_num_threads(flags.threads);
  constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;
  const AttentionParams params{kHeads, 1.0f / std::sqrt(float(kHeadDim)), 0.0f, 0};
  std::vector<float> q(kHeads * kHeadDim), out(kHeads * kHeadDim);
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& x : q) x = normal(gen);
  ReadBandwidth bandwidth;

  nlohmann::json results = nlohmann::json::array();
  if (!flags.json) {
    std::printf(
        "decode attention: %d query heads, %d KV heads, d=%d, %d threads, kernels %s, "
        "TurboQuant products %s (CPU: %s)\n"
        "median and min us of interleaved rounds; paired = median over rounds of dense us / "
        "us in the same round; speedup = dense median / median (min / min); GB/s = cache bytes "
        "read per second at the min; read = streaming-read loop (best pass), same run\n",
        kHeads, kKvHeads, kHeadDim, flags.threads, attention_isa_name(isa),
        flags.products.empty() ? products_name(products[0]) : flags.products.c_str(),
        cpu_feature_names());
    std::printf("%8s %-20s %10s %10s %7s %15s %8s %8s\n", "context", "cache", "median_us",
                "min_us", "paired", "speedup", "GB/s", "read");
  }
  for (const int64_t context : contexts) {
    const int repeats = flags.repeats > 0
                            ? flags.repeats
                            : static_cast<int>(std::clamp<int64_t>((1 << 22) / context, 9, 200));
    std::vector<BenchCache> caches;
    caches.push_back(
        {"dense_f16", std::make_unique<DenseKVCache>(kKvHeads, kHeadDim, KVDType::kF16), {}});
    for (const auto& [name, config] : turboquant) {
      for (const CodeProducts p : products) {
        const std::string label = products.size() > 1 ? name + "/" + products_name(p) : name;
        caches.push_back(
            {label, std::make_unique<TurboQuantKVCache>(kKvHeads, kHeadDim, config), {}, p});
      }
    }
    caches.push_back(
        {"uniform_4",
         std::make_unique<UniformKVCache>(kKvHeads, kHeadDim, UniformKVConfig{4, 4, 64}),
         {}});
    for (auto& c : caches) {
      fill(*c.cache, context, 1);
      c.attend(q.data(), params, out.data(), isa);  // warm-up
    }
    // Interleaved, so load from other processes hits all sides alike; the read loop runs
    // every fourth round.
    std::vector<double> read_us;
    for (int i = 0; i < repeats; ++i) {
      for (auto& c : caches) {
        const auto start = std::chrono::steady_clock::now();
        c.attend(q.data(), params, out.data(), isa);
        c.us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count());
      }
      if (i % 4 == 0) read_us.push_back(bandwidth.time_us());
    }
    const double read_gbps = ReadBandwidth::kBytes / minimum(read_us) / 1e3;
    const double dense_median = median(caches[0].us), dense_min = minimum(caches[0].us);
    nlohmann::json row = {{"context", context},
                          {"repeats", repeats},
                          {"read_gbps", read_gbps},
                          {"caches", nlohmann::json::array()}};
    for (const auto& c : caches) {
      const double med = median(c.us), best = minimum(c.us);
      const double gbps = c.cache->nbytes() / best / 1e3;
      // The ratio within each round: a burst of load that hits one round hits both sides.
      std::vector<double> round_ratios;
      for (size_t i = 0; i < c.us.size(); ++i) round_ratios.push_back(caches[0].us[i] / c.us[i]);
      const double paired = median(round_ratios);
      row["caches"].push_back({{"cache", c.name},
                               {"median_us", med},
                               {"min_us", best},
                               {"speedup", dense_median / med},
                               {"speedup_paired", paired},
                               {"speedup_min", dense_min / best},
                               {"gbps", gbps},
                               {"bytes", c.cache->nbytes()}});
      if (!flags.json) {
        char speedup[32];
        std::snprintf(speedup, sizeof(speedup), "%.2fx (%.2fx)", dense_median / med,
                      dense_min / best);
        std::printf("%8lld %-20s %10.1f %10.1f %6.2fx %15s %8.1f %8.1f\n",
                    static_cast<long long>(context), c.name.c_str(), med, best, paired, speedup,
                    gbps, read_gbps);
      }
    }
    results.push_back(row);
  }
  if (flags.json) {
    nlohmann::json doc = {{"device", flags.device},
                          {"threads", flags.threads},
                          {"isa", attention_isa_name(isa)},
                          {"products", flags.products.empty() ? products_name(products[0])
                                                              : flags.products},
                          {"cpu_features", cpu_feature_names()},
                          {"heads", kHeads},
                          {"kv_heads", kKvHeads},
                          {"head_dim", kHeadDim},
                          {"uniform", "uniform 4-bit g64"},
                          {"read_checksum", bandwidth.checksum()},
                          {"results", results}};
    std::printf("%s\n", doc.dump().c_str());
  }
  set_code_products(products_before);
  return 0;
}

int bench_main(int argc, char** argv) {
  CLI::App app("benchmarks: both sides measured in one run, and the ratio", "bench");
  app.require_subcommand(1);
  AttentionBenchFlags attention;
  CLI::App* attention_cmd =
      app.add_subcommand("attention", "decode attention: dense f16 vs TurboQuant vs uniform 4");
  attention_cmd->add_option("--device", attention.device, "cpu (cuda: not in this build)");
  attention_cmd->add_option("--contexts", attention.contexts, "comma-separated context lengths");
  attention_cmd->add_option("--threads", attention.threads, "worker threads")
      ->check(integer_in(0, 1024));
  attention_cmd->add_option("--repeats", attention.repeats, "timed runs per kernel (median)")
      ->check(integer_in(0, 1 << 20));
  attention_cmd->add_option(
      "--turboquant-bits", attention.turboquant_bits,
      "comma-separated TurboQuant --kv-bits to compare (e.g. 3.5,4,2.5; K/V for "
      "explicit key and value bits, e.g. 4/3)");
  attention_cmd->add_option("--isa", attention.isa,
                            "kernels' instruction set: best, avx512, avx2, scalar");
  attention_cmd->add_option("--products", attention.products,
                            "TurboQuant codebook products to compare, e.g. int8,exact (default: "
                            "int8, or exact under TURBOKV_EXACT_ATTENTION=1)");
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
