// `turbokv bench e2e`: prefill (one forward over a prompt) and decode (one token per forward,
// greedy) tokens/s of the whole model, with the dense KV cache and with a quantized one, in
// the same run; prints both and the ratio. The prompt is deterministic pseudo-random token ids.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_e2e.h"
#include "core/error.h"
#include "core/threads.h"
#include "kv/cache_policy.h"
#include "model/model.h"

namespace turbokv::cli {
namespace {

struct Speed {
  double prefill_tps = 0;
  double decode_tps = 0;
  size_t kv_bytes = 0;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Speed measure(const Model& model, const std::vector<int32_t>& prompt, int gen_tokens,
              const ResolvedKV& kv) {
  const int V = model.info().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  LayerCaches caches = make_layer_caches(model.layer_specs(), kv);
  Speed speed;
  auto start = std::chrono::steady_clock::now();
  Model::Chunk prefill{prompt.data(), int(prompt.size()), &caches, logits.data(), false};
  model.forward({&prefill, 1});
  speed.prefill_tps = double(prompt.size()) / seconds_since(start);
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < gen_tokens; ++i) {
    int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    Model::Chunk step{&next, 1, &caches, logits.data(), false};
    model.forward({&step, 1});
  }
  speed.decode_tps = double(gen_tokens) / seconds_since(start);
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
  std::printf("%-12s %12s %12s %12s\n", "kv", "prefill t/s", "decode t/s", "kv bytes");
  std::printf("%-12s %12.1f %12.1f %12zu\n", "dense", dense.prefill_tps, dense.decode_tps,
              dense.kv_bytes);
  std::printf("%-12s %12.1f %12.1f %12zu\n", scheme.c_str(), quantized.prefill_tps,
              quantized.decode_tps, quantized.kv_bytes);
  std::printf("%-12s %12.2fx %11.2fx\n", "ratio", quantized.prefill_tps / dense.prefill_tps,
              quantized.decode_tps / dense.decode_tps);
  return 0;
}

}  // namespace turbokv::cli
