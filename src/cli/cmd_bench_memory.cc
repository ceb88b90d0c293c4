// `turbokv bench memory`: builds the caches the policy gives one sequence (make_layer_caches),
// appends `context` synthetic tokens (one random block repeated) to each layer, and reports the
// exact bytes per layer kind, dense fp16 vs the chosen KV flags. Only config.json is read. Each
// layer's cache is measured, then freed before the next one is filled, so the peak memory is one
// layer's cache.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>
#include <vector>

#include "cli/bench_memory.h"
#include "core/error.h"
#include "kv/cache_policy.h"
#include "kv/dense_kv_cache.h"
#include "kv/kv_resolve.h"
#include "model/config.h"
#include "model/decoder.h"

namespace turbokv::cli {
namespace {

// Tokens per append: sliding layers get the engine's default prefill chunk (a rotating cache
// holds W - 1 plus the last chunk); other caches take bigger chunks, which only changes how
// often their buffers grow.
constexpr int kSlidingChunk = 256;
constexpr int kChunk = 16384;

struct LayerBytes {
  LayerCachePlan plan;
  size_t kv_bytes = 0;
  size_t state_bytes = 0;
};

// Fills every layer of a fresh cache set with `context` tokens; returns the bytes per layer.
std::vector<LayerBytes> measure(const std::vector<LayerSpec>& specs, const ResolvedKV& kv,
                                int64_t context) {
  const std::vector<LayerCachePlan> plan = plan_layer_caches(specs, kv);
  LayerCaches caches = make_layer_caches(plan, KVDType::kF16);
  std::vector<bool> shared_later(specs.size(), false);
  for (const LayerSpec& s : specs) {
    if (s.kind == LayerStateKind::kShared) shared_later[size_t(s.shared_with)] = true;
  }
  std::vector<LayerBytes> out;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < specs.size(); ++i) {
    KVCache& cache = *caches[i];
    const LayerCacheKind kind = plan[i].kind;
    if (kind != LayerCacheKind::kRecurrent && kind != LayerCacheKind::kShared) {
      const int64_t row = int64_t(specs[i].kv_heads) * specs[i].head_dim;
      const int chunk = kind == LayerCacheKind::kRotating ? kSlidingChunk : kChunk;
      std::vector<float> k(size_t(chunk * row)), v(size_t(chunk * row));  // [chunk, kv, hd]
      for (float& x : k) x = normal(gen);
      for (float& x : v) x = normal(gen);
      for (int64_t done = 0; done < context; done += chunk) {
        cache.append(k.data(), v.data(), int(std::min<int64_t>(chunk, context - done)));
      }
    }
    out.push_back(LayerBytes{plan[i], cache.nbytes(), cache.state_bytes()});
    if (!shared_later[i]) caches[i] = std::make_unique<DenseKVCache>(1, 1);  // free it
  }
  return out;
}

std::string gib(size_t bytes) {
  return str_cat(bytes / 1e9, " GB (", double(bytes) / double(1ull << 30), " GiB)");
}

}  // namespace

CLI::App* add_memory_bench(CLI::App& bench, MemoryBenchFlags& flags) {
  CLI::App* cmd = bench.add_subcommand(
      "memory", "KV bytes of one sequence per layer kind: dense fp16 vs the KV flags");
  cmd->add_option("--model", flags.model_dir, "model directory (only config.json is read)");
  cmd->add_option("--context", flags.context, "tokens in the sequence")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_flag("--json", flags.json, "print one JSON object");
  flags.kv.add_to(*cmd);
  return cmd;
}

int run_memory_bench(const MemoryBenchFlags& flags) {
  const ModelConfig config = load_model_config(flags.model_dir);
  const std::vector<LayerSpec> specs = layer_specs_for(config);
  const ResolvedKV chosen = resolve_kv_options(flags.kv.options());
  const std::vector<LayerBytes> dense = measure(specs, ResolvedKV{}, flags.context);
  const std::vector<LayerBytes> quant =
      chosen.scheme == KVScheme::kDense ? dense : measure(specs, chosen, flags.context);

  // Rows per (layer kind, chosen cache type, sliding window).
  struct Row {
    int layers = 0;
    size_t dense = 0, chosen = 0, state = 0;
  };
  std::map<std::tuple<std::string, std::string, int>, Row> rows;
  size_t total_dense = 0, total = 0, state = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const LayerCachePlan& p = quant[i].plan;
    Row& r = rows[{layer_state_kind_name(p.layer), layer_cache_kind_name(p.kind), p.window}];
    ++r.layers;
    r.dense += dense[i].kv_bytes;
    r.chosen += quant[i].kv_bytes;
    r.state += quant[i].state_bytes;
    total_dense += dense[i].kv_bytes;
    total += quant[i].kv_bytes;
    state += quant[i].state_bytes;
  }
  const double ratio = total_dense ? double(total) / double(total_dense) : 0.0;
  if (flags.json) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& [key, r] : rows) {
      layers.push_back({{"kind", std::get<0>(key)},
                        {"cache", std::get<1>(key)},
                        {"sliding_window", std::get<2>(key)},
                        {"layers", r.layers},
                        {"kv_bytes_dense", r.dense},
                        {"kv_bytes", r.chosen},
                        {"state_bytes", r.state}});
    }
    const nlohmann::json doc = {{"model_type", config.model_type},
                                {"num_layers", config.num_layers},
                                {"context", flags.context},
                                {"kv_scheme", kv_scheme_name(chosen.scheme)},
                                {"kv_key_bits", chosen.key_bits},
                                {"kv_value_bits", chosen.value_bits},
                                {"layers", layers},
                                {"kv_bytes_dense", total_dense},
                                {"kv_bytes", total},
                                {"ratio", ratio},
                                {"state_bytes", state}};
    std::printf("%s\n", doc.dump().c_str());
    return 0;
  }
  std::printf("%s, %d layers, one sequence of %lld tokens; KV %s (keys %g, values %g bits)\n",
              config.model_type.c_str(), config.num_layers, static_cast<long long>(flags.context),
              kv_scheme_name(chosen.scheme), chosen.key_bits, chosen.value_bits);
  std::printf("%-10s %-11s %7s %6s %16s %16s %14s\n", "kind", "cache", "window", "layers",
              "dense fp16 B", "chosen B", "state B");
  for (const auto& [key, r] : rows) {
    std::printf("%-10s %-11s %7d %6d %16zu %16zu %14zu\n", std::get<0>(key).c_str(),
                std::get<1>(key).c_str(), std::get<2>(key), r.layers, r.dense, r.chosen, r.state);
  }
  std::printf("KV total: dense %s -> chosen %s, ratio %.4f\n", gib(total_dense).c_str(),
              gib(total).c_str(), ratio);
  std::printf("recurrent state (not KV, the same under every scheme): %s\n", gib(state).c_str());
  return 0;
}

}  // namespace turbokv::cli
