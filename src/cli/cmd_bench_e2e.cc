// `turbokv bench e2e`: prefill (one forward over a prompt) and decode (one token per forward,
// greedy) tokens/s of the whole model, with the dense KV cache and with a quantized one, in
// the same run; prints both and the ratio. The prompt is deterministic pseudo-random token ids.
// With --compare-model, checkpoints of the same model in other weight formats are measured
// against --model instead (quantized KV cache on every side), with the weight bytes read per
// decoded token, the GB/s that makes, and the machine's read bandwidth measured in the run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli/bench_e2e.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/threads.h"
#include "kv/cache_policy.h"
#include "kv/kv_resolve.h"
#include "model/model.h"

#ifdef TURBOKV_HAVE_CUDA
#include "eval/gpu_bench.h"
#include "model/cuda/cuda_decoder.h"
#endif

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

// Streaming read bandwidth with the pool's threads: GB/s of summing a buffer far larger than
// the caches, best of a few passes.
double measure_read_bandwidth() {
  constexpr int64_t kWords = int64_t(1) << 26;  // 512 MiB of uint64
  std::vector<uint64_t> buffer(static_cast<size_t>(kWords));
  parallel_for(kWords, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buffer[size_t(i)] = uint64_t(i);
  });
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<uint64_t> sums(64, 0);
    const Stopwatch time;
    parallel_for(64, 1, [&](int64_t b, int64_t e) {
      for (int64_t part = b; part < e; ++part) {
        const uint64_t* p = buffer.data() + part * (kWords / 64);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int64_t i = 0; i < kWords / 64; i += 4) {
          s0 += p[i];
          s1 += p[i + 1];
          s2 += p[i + 2];
          s3 += p[i + 3];
        }
        sums[size_t(part)] = s0 + s1 + s2 + s3;
      }
    });
    const double seconds = time.wall_seconds();
    volatile uint64_t sink = 0;
    for (uint64_t v : sums) sink = sink + v;
    best = std::max(best, double(kWords) * 8 / seconds / 1e9);
  }
  return best;
}

int run_weights_comparison(const E2EBenchFlags& flags, const ResolvedKV& kv) {
  std::vector<std::string> paths = {flags.model_dir};
  paths.insert(paths.end(), flags.compare_models.begin(), flags.compare_models.end());
  std::vector<std::unique_ptr<Model>> models;
  for (const std::string& path : paths) models.push_back(Model::load(path));
  const int V = models.front()->info().vocab_size;
  for (size_t i = 1; i < models.size(); ++i) {
    if (models[i]->info().vocab_size != V) {
      throw InvalidArgument(str_cat("--compare-model ", paths[i], " has vocabulary ",
                                    models[i]->info().vocab_size, ", --model ", paths[0], " has ",
                                    V, ": compare checkpoints of one model"));
    }
  }
  std::mt19937 gen(0);
  std::uniform_int_distribution<int32_t> token(0, V - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(flags.prompt_tokens));
  for (int32_t& t : prompt) t = token(gen);
  const std::vector<int32_t> warm(prompt.begin(),
                                  prompt.begin() + std::min<size_t>(prompt.size(), 16));
  for (const auto& model : models) measure(*model, warm, 2, kv);
  // The models take turns within each repeat, so a busy machine slows all alike.
  std::vector<std::vector<Speed>> runs(models.size());
  for (int r = 0; r < flags.repeats; ++r) {
    for (size_t i = 0; i < models.size(); ++i) {
      runs[i].push_back(measure(*models[i], prompt, flags.gen_tokens, kv));
    }
  }
  const double bandwidth = measure_read_bandwidth();
  std::vector<Speed> speeds;
  for (auto& r : runs) speeds.push_back(median(r));
  const std::string scheme = kv_scheme_name(kv.scheme);
  if (flags.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < models.size(); ++i) {
      const double bytes = double(models[i]->decode_weight_bytes());
      rows.push_back({{"model", paths[i]},
                      {"prefill_tps", speeds[i].prefill_tps},
                      {"decode_tps", speeds[i].decode_tps},
                      {"decode_ratio", speeds[i].decode_tps / speeds[0].decode_tps},
                      {"decode_tps_cpu", speeds[i].decode_tps_cpu},
                      {"decode_cpu_ratio", speeds[i].decode_tps_cpu / speeds[0].decode_tps_cpu},
                      {"prefill_ratio", speeds[i].prefill_tps / speeds[0].prefill_tps},
                      {"weight_bytes_per_token", bytes},
                      {"weight_gbps", bytes * speeds[i].decode_tps / 1e9}});
    }
    const nlohmann::json out = {{"threads", flags.threads},
                                {"prompt_tokens", flags.prompt_tokens},
                                {"gen_tokens", flags.gen_tokens},
                                {"repeats", flags.repeats},
                                {"kv", scheme},
                                {"read_bandwidth_gbps", bandwidth},
                                {"results", rows}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%d threads, KV %s, decode at depth %d, %d decoded tokens, medians of %d runs\n",
              flags.threads, scheme.c_str(), flags.prompt_tokens, flags.gen_tokens, flags.repeats);
  std::printf("%-44s %12s %12s %8s %14s %8s %12s %10s\n", "model", "prefill t/s", "decode t/s",
              "ratio", "decode t/cpu-s", "ratio", "weights MB/t", "GB/s");
  for (size_t i = 0; i < models.size(); ++i) {
    const double bytes = double(models[i]->decode_weight_bytes());
    std::string name = paths[i];
    if (name.size() > 44) name = "..." + name.substr(name.size() - 41);
    std::printf("%-44s %12.1f %12.2f %7.2fx %14.2f %7.2fx %12.1f %10.2f\n", name.c_str(),
                speeds[i].prefill_tps, speeds[i].decode_tps,
                speeds[i].decode_tps / speeds[0].decode_tps, speeds[i].decode_tps_cpu,
                speeds[i].decode_tps_cpu / speeds[0].decode_tps_cpu, bytes / 1e6,
                bytes * speeds[i].decode_tps / 1e9);
  }
  std::printf("measured read bandwidth (%d threads, 512 MiB buffer): %.2f GB/s\n", flags.threads,
              bandwidth);
  return 0;
}

// --device cuda: prefill tok/s and decode tok/s at each depth, dense vs the KV flags vs
// uniform 4 (eval/gpu_bench.h), ratios to dense.
int run_gpu_bench(const E2EBenchFlags& flags, const ResolvedKV& quant) {
#ifdef TURBOKV_HAVE_CUDA
  std::vector<int64_t> depths;
  std::stringstream in(flags.depths);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const long long d = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || d < 0 || d > (int64_t(1) << 31)) {
      throw InvalidArgument(str_cat("--depths: '", item, "' is not a depth in 0..2^31"));
    }
    depths.push_back(d);
  }
  if (flags.batch < 1 || flags.batch > 1024) {
    throw InvalidArgument(str_cat("--batch ", flags.batch, " is out of range (1..1024)"));
  }
  LoadedModel loaded = load_model(flags.model_dir, flags.device.options());
  const auto& model = dynamic_cast<const cuda::CudaDecoderModel&>(*loaded.model);
  KVOptions uniform;
  uniform.kv_bits = 4;
  const std::vector<std::pair<std::string, ResolvedKV>> sides = {
      {"dense", ResolvedKV{}},
      {str_cat(kv_scheme_name(quant.scheme), " ", quant.key_bits, "/", quant.value_bits), quant},
      {"uniform 4", resolve_kv_options(uniform)}};
  nlohmann::json rows = nlohmann::json::array();
  std::printf("GPU, batch %d, prefill %d tokens; decode tok/s (ratio to dense)\n", flags.batch,
              flags.prompt_tokens);
  std::printf("%-18s %12s", "kv", "prefill t/s");
  for (int64_t d : depths) std::printf(" %20s", str_cat("depth ", d).c_str());
  std::printf("\n");
  std::vector<std::vector<double>> tps(sides.size());
  for (size_t i = 0; i < sides.size(); ++i) {
    const double prefill = eval::gpu_prefill_tokens_per_s(model, sides[i].second,
                                                           flags.prompt_tokens);
    std::printf("%-18s %12.0f", sides[i].first.c_str(), prefill);
    nlohmann::json row = {{"kv", sides[i].first}, {"prefill_tps", prefill}};
    for (int64_t d : depths) {
      const eval::GpuDecodeResult r =
          eval::gpu_decode(model, sides[i].second, flags.batch, d, 3, flags.gen_tokens);
      tps[i].push_back(r.tokens_per_s);
      std::printf(" %12.1f (%5.2fx)", r.tokens_per_s, r.tokens_per_s / tps[0][tps[i].size() - 1]);
      row["decode"].push_back({{"depth", d},
                               {"tokens_per_s", r.tokens_per_s},
                               {"ratio_to_dense", r.tokens_per_s / tps[0][tps[i].size() - 1]},
                               {"kv_bytes", r.kv_bytes},
                               {"kv_bytes_dense", r.kv_bytes_dense}});
    }
    std::printf("\n");
    rows.push_back(row);
  }
  if (flags.json) {
    std::printf("%s\n", nlohmann::json({{"device", "cuda"}, {"batch", flags.batch},
                                        {"results", rows}})
                             .dump()
                             .c_str());
  }
  return 0;
#else
  (void)flags;
  (void)quant;
  throw InvalidArgument("--device cuda: this build of turbokv has no CUDA support");
#endif
}

}  // namespace

CLI::App* add_e2e_bench(CLI::App& bench, E2EBenchFlags& flags) {
  CLI::App* cmd = bench.add_subcommand(
      "e2e", "whole-model prefill and decode tokens/s: dense KV vs a quantized KV cache");
  cmd->add_option("--model", flags.model_dir, "model directory (default: the shipped model)");
  cmd->add_option("--prompt-tokens", flags.prompt_tokens, "prompt length")
      ->capture_default_str()
      ->check(integer_in(1, INT32_MAX));
  cmd->add_option("--gen-tokens", flags.gen_tokens, "decoded tokens")
      ->capture_default_str()
      ->check(integer_in(1, INT32_MAX));
  cmd->add_option("--threads", flags.threads, "worker threads")
      ->capture_default_str()
      ->check(integer_in(0, 1024));
  cmd->add_option("--repeats", flags.repeats, "runs per side (medians)")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 20));
  cmd->add_flag("--json", flags.json, "print one JSON object");
  cmd->add_option("--compare-model", flags.compare_models,
                  "another checkpoint (directory or .gguf) measured against --model in the same "
                  "run, quantized KV on both (repeatable)");
  flags.kv.kv_bits = "3.5";
  flags.kv.add_to(*cmd);
  flags.device.add_to(*cmd);
  cmd->add_option("--depths", flags.depths, "cuda: comma-separated cache depths")
      ->capture_default_str();
  cmd->add_option("--batch", flags.batch, "cuda: sequences decoded together")
      ->capture_default_str();
  return cmd;
}

int run_e2e_bench(const E2EBenchFlags& flags) {
  if (flags.prompt_tokens < 1 || flags.gen_tokens < 1 || flags.repeats < 1) {
    throw InvalidArgument(str_cat("--prompt-tokens ", flags.prompt_tokens, ", --gen-tokens ",
                                  flags.gen_tokens, " and --repeats ", flags.repeats,
                                  " must be >= 1"));
  }
  const ResolvedKV quant = resolve_kv_options(flags.kv.options());
  check_device(flags.device.options());
  if (flags.device.device == "cuda") return run_gpu_bench(flags, quant);
  set_num_threads(flags.threads);
  if (!flags.compare_models.empty()) return run_weights_comparison(flags, quant);
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
