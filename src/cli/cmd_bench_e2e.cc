// `turbokv bench e2e`: prefill (one forward over a prompt) and decode (one token per forward,
// greedy) tokens/s of the whole model, with the dense KV cache and with a quantized one, in
// the same run; prints both and the ratio. The prompt is deterministic pseudo-random token ids.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_e2e.h"
#include "core/error.h"
#include "core/threads.h"
#include "kv/cache_policy.h"
#include "kv/kv_resolve.h"
#include "model/model.h"

namespace turbokv::cli {
namespace {

struct Speed {
  double prefill_tps = 0;
  double decode_tps = 0;
  // Tokens per CPU-second of the process (all threads): on a shared, busy machine this stays
  // put while wall-clock rates drop; threads × this bounds the rate of an idle machine.
  double prefill_tps_cpu = 0;
  double decode_tps_cpu = 0;
  size_t kv_bytes = 0;
};

// Wall-clock and process CPU seconds since construction.
struct Stopwatch {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  std::clock_t cpu = std::clock();
  double wall_seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
  }
  double cpu_seconds() const { return double(std::clock() - cpu) / CLOCKS_PER_SEC; }
};

Speed measure(const Model& model, const std::vector<int32_t>& prompt, int gen_tokens,
              const ResolvedKV& kv) {
  const int V = model.info().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  LayerCaches caches = make_layer_caches(model.layer_specs(), kv);
  Speed speed;
  Stopwatch prefill_time;
  Model::Chunk prefill{prompt.data(), int(prompt.size()), &caches, logits.data(), false};
  model.forward({&prefill, 1});
  speed.prefill_tps = double(prompt.size()) / prefill_time.wall_seconds();
  speed.prefill_tps_cpu = double(prompt.size()) / prefill_time.cpu_seconds();
  Stopwatch decode_time;
  for (int i = 0; i < gen_tokens; ++i) {
    int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    Model::Chunk step{&next, 1, &caches, logits.data(), false};
    model.forward({&step, 1});
  }
  speed.decode_tps = double(gen_tokens) / decode_time.wall_seconds();
  speed.decode_tps_cpu = double(gen_tokens) / decode_time.cpu_seconds();
  for (const auto& c : caches) speed.kv_bytes += c->nbytes();
  return speed;
}

// Per-field medians of the runs.
Speed median(std::vector<Speed> runs) {
  auto middle = [&](auto field) {
    std::sort(runs.begin(), runs.end(),
              [&](const Speed& a, const Speed& b) { return a.*field < b.*field; });
    return runs[runs.size() / 2].*field;
  };
  Speed m;
  m.prefill_tps = middle(&Speed::prefill_tps);
  m.decode_tps = middle(&Speed::decode_tps);
  m.prefill_tps_cpu = middle(&Speed::prefill_tps_cpu);
  m.decode_tps_cpu = middle(&Speed::decode_tps_cpu);
  m.kv_bytes = runs.front().kv_bytes;
  return m;
}

}  // namespace

CLI::App* add_e2e_bench(CLI::App& bench, E2EBenchFlags& flags) {
  CLI::App* cmd = bench.add_subcommand(
      "e2e", "whole-model prefill and decode tokens/s: dense KV vs a quantized KV cache");
  cmd->add_option("--model", flags.model_dir, "model directory (default: the shipped model)");
  cmd->add_option("--prompt-tokens", flags.prompt_tokens, "prompt length")->capture_default_str();
  cmd->add_option("--gen-tokens", flags.gen_tokens, "decoded tokens")->capture_default_str();
  cmd->add_option("--threads", flags.threads, "worker threads")->capture_default_str();
  cmd->add_option("--repeats", flags.repeats, "runs per side (medians)")->capture_default_str();
  cmd->add_flag("--json", flags.json, "print one JSON object");
  flags.kv.kv_bits = "3.5";
  flags.kv.add_to(*cmd);
  return cmd;
}

int run_e2e_bench(const E2EBenchFlags& flags) {
  if (flags.prompt_tokens < 1 || flags.gen_tokens < 1 || flags.repeats < 1) {
    throw InvalidArgument(str_cat("--prompt-tokens ", flags.prompt_tokens, ", --gen-tokens ",
                                  flags.gen_tokens, " and --repeats ", flags.repeats,
                                  " must be >= 1"));
  }
  const ResolvedKV quant = resolve_kv_options(flags.kv.options());
  set_num_threads(flags.threads);
  std::unique_ptr<Model> model = Model::load(flags.model_dir);
  std::mt19937 gen(0);
  std::uniform_int_distribution<int32_t> token(0, model->info().vocab_size - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(flags.prompt_tokens));
  for (int32_t& t : prompt) t = token(gen);

  measure(
      *model,
      std::vector<int32_t>(prompt.begin(), prompt.begin() + std::min<size_t>(prompt.size(), 16)), 2,
      ResolvedKV{});  // warm-up: page in the weights, start the pool
  // Dense and quantized runs alternate, so a busy machine slows both alike; medians reported.
  std::vector<Speed> dense_runs, quantized_runs;
  for (int r = 0; r < flags.repeats; ++r) {
    dense_runs.push_back(measure(*model, prompt, flags.gen_tokens, ResolvedKV{}));
    quantized_runs.push_back(measure(*model, prompt, flags.gen_tokens, quant));
  }
  const Speed dense = median(dense_runs), quantized = median(quantized_runs);
  const std::string scheme = kv_scheme_name(quant.scheme);
  if (flags.json) {
    auto row = [](const char* name, const Speed& s) {
      return nlohmann::json{{"kv", name},
                            {"prefill_tps", s.prefill_tps},
                            {"decode_tps", s.decode_tps},
                            {"prefill_tps_per_cpu_second", s.prefill_tps_cpu},
                            {"decode_tps_per_cpu_second", s.decode_tps_cpu},
                            {"kv_bytes", s.kv_bytes}};
    };
    nlohmann::json out = {{"model", flags.model_dir},
                          {"threads", flags.threads},
                          {"prompt_tokens", flags.prompt_tokens},
                          {"gen_tokens", flags.gen_tokens},
                          {"repeats", flags.repeats},
                          {"results", {row("dense", dense), row(scheme.c_str(), quantized)}},
                          {"prefill_ratio", quantized.prefill_tps / dense.prefill_tps},
                          {"decode_ratio", quantized.decode_tps / dense.decode_tps}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%d threads, prompt %d tokens, %d decoded tokens, medians of %d runs\n",
              flags.threads, flags.prompt_tokens, flags.gen_tokens, flags.repeats);
  std::printf("%-12s %12s %12s %14s %14s %10s\n", "kv", "prefill t/s", "decode t/s",
              "prefill t/cpu-s", "decode t/cpu-s", "kv bytes");
  auto print_row = [](const char* name, const Speed& s) {
    std::printf("%-12s %12.1f %12.1f %14.1f %14.1f %10zu\n", name, s.prefill_tps, s.decode_tps,
                s.prefill_tps_cpu, s.decode_tps_cpu, s.kv_bytes);
  };
  print_row("dense", dense);
  print_row(scheme.c_str(), quantized);
  std::printf("%-12s %11.2fx %11.2fx %13.2fx %13.2fx\n", "ratio",
              quantized.prefill_tps / dense.prefill_tps, quantized.decode_tps / dense.decode_tps,
              quantized.prefill_tps_cpu / dense.prefill_tps_cpu,
              quantized.decode_tps_cpu / dense.decode_tps_cpu);
  return 0;
}

}  // namespace turbokv::cli
