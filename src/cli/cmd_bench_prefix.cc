// `turbokv bench prefix`: a shared prefix followed by a short question, asked twice with two
// different questions. The first request prefills everything (the prefix is not cached yet);
// the second finds the prefix's full blocks in the prefix cache and prefills only the rest.
// Prints both times to first token (measured by the client, from submit to the first token,
// the restore included) and their ratio, for the dense cache and for the KV flags' cache in
// the same engine, plus the bytes the prefix cache holds after the first request (and their
// fp16 equivalent). Each repeat uses a new prefix, so every first request is cold.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_prefix.h"
#include "core/error.h"
#include "core/text_file.h"
#include "core/threads.h"
#include "kv/cache_file.h"
#include "kv/kv_resolve.h"
#include "turbokv/engine.h"

namespace turbokv::cli {
namespace {

struct Side {
  std::string name;
  std::optional<KVOptions> kv;
  std::vector<double> cold_ms, warm_ms;
  int64_t restored = 0;
  size_t bytes = 0, bytes_dense = 0;
  int64_t tokens_held = 0;
};

// Client-side time to the first token of prompt, and the request's cached prompt tokens.
std::pair<double, int64_t> first_token(Engine& engine, std::vector<int32_t> prompt,
                                       const GenerateOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto stream = engine.submit(std::move(prompt), options);
  GenerationChunk chunk;
  double ms = -1;
  int64_t cached = 0;
  while (stream->next(&chunk)) {
    if (ms < 0 && (chunk.token >= 0 || chunk.done)) {
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
               .count();
    }
    cached = chunk.stats.prompt_cached_tokens;
  }
  return {ms, cached};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

CLI::App* add_prefix_bench(CLI::App& bench, PrefixBenchFlags& flags) {
  CLI::App* cmd = bench.add_subcommand(
      "prefix", "time to first token with a cold and a cached shared prefix, and its bytes");
  cmd->add_option("--model", flags.model_dir, "model directory (default: the shipped model)");
  cmd->add_option("--text", flags.text_file,
                  "take the prefixes from this text file's tokens (default: random token ids)");
  cmd->add_option("--prefix-tokens", flags.prefix_tokens, "shared prefix length")
      ->capture_default_str();
  cmd->add_option("--question-tokens", flags.question_tokens, "tokens after the prefix")
      ->capture_default_str();
  cmd->add_option("--threads", flags.threads, "worker threads")->capture_default_str();
  cmd->add_option("--repeats", flags.repeats, "prefixes per side (medians)")->capture_default_str();
  cmd->add_flag("--json", flags.json, "print one JSON object");
  flags.kv.kv_bits = "3.5";
  flags.kv.add_to(*cmd);
  return cmd;
}

int run_prefix_bench(const PrefixBenchFlags& flags) {
  if (flags.prefix_tokens < 64 || flags.question_tokens < 1 || flags.repeats < 1 ||
      flags.threads < 1) {
    throw InvalidArgument(str_cat("--prefix-tokens ", flags.prefix_tokens, " (>= 64), ",
                                  "--question-tokens ", flags.question_tokens, ", --repeats ",
                                  flags.repeats, " and --threads ", flags.threads,
                                  " (>= 1) are out of range"));
  }
  const KVOptions quant_kv = flags.kv.options();
  const ResolvedKV quant = resolve_kv_options(quant_kv);
  set_num_threads(flags.threads);
  EngineOptions options;
  options.max_sequences = 1;
  options.prefix_cache_bytes = int64_t(4) << 30;
  auto engine = Engine::load(flags.model_dir, options);
  const int64_t length = int64_t(flags.prefix_tokens) + flags.question_tokens;
  if (length > engine->summary().context_length) {
    throw InvalidArgument(str_cat("--prefix-tokens + --question-tokens = ", length,
                                  " exceeds the model's context of ",
                                  engine->summary().context_length));
  }
  std::vector<int32_t> text;
  if (!flags.text_file.empty()) {
    text = engine->encode(read_file(flags.text_file), /*add_special_tokens=*/false);
    const int64_t needed = int64_t(flags.repeats) * length + flags.question_tokens;
    if (static_cast<int64_t>(text.size()) < needed) {
      throw InvalidArgument(str_cat("--text: ", text.size(), " tokens, the runs need ", needed));
    }
  }
  std::mt19937 gen(1);
  std::uniform_int_distribution<int32_t> token(0, engine->summary().vocab_size - 1);
  auto piece = [&](int64_t offset, int64_t n) {
    std::vector<int32_t> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      out[size_t(i)] = text.empty() ? token(gen) : text[size_t(offset + i)];
    }
    return out;
  };

  GenerateOptions request;
  request.max_tokens = 1;
  request.ignore_eos = true;
  first_token(*engine, piece(0, 16), request);  // warm-up: page in the weights, start the pool
  std::vector<Side> sides = {{"dense", KVOptions{}, {}, {}},
                             {kv_scheme_name(quant.scheme), quant_kv, {}, {}}};
  for (int r = 0; r < flags.repeats; ++r) {
    for (Side& side : sides) {  // alternating, so a busy machine slows both sides alike
      const int64_t base = (r * int64_t(sides.size()) + (&side - sides.data())) * length;
      const std::vector<int32_t> prefix = piece(base, flags.prefix_tokens);
      std::vector<int32_t> first = prefix, second = prefix;
      const auto q1 = piece(base + flags.prefix_tokens, flags.question_tokens);
      const auto q2 = piece(base + flags.prefix_tokens + 1, flags.question_tokens);
      first.insert(first.end(), q1.begin(), q1.end());
      second.insert(second.end(), q2.begin(), q2.end());
      GenerateOptions o = request;
      o.kv = side.kv;
      const EngineMetrics before = engine->metrics();
      side.cold_ms.push_back(first_token(*engine, first, o).first);
      const EngineMetrics after = engine->metrics();
      const auto [warm_ms, restored] = first_token(*engine, second, o);
      side.warm_ms.push_back(warm_ms);
      if (r == 0) {
        side.restored = restored;
        side.bytes = after.prefix_cache_bytes - before.prefix_cache_bytes;
        side.bytes_dense = after.prefix_cache_bytes_dense - before.prefix_cache_bytes_dense;
        side.tokens_held = after.prefix_cache_tokens - before.prefix_cache_tokens;
      }
    }
  }

  const double bytes_ratio = double(sides[1].bytes) / double(sides[0].bytes);
  if (flags.json) {
    nlohmann::json results = nlohmann::json::array();
    for (const Side& s : sides) {
      results.push_back({{"kv", s.name},
                         {"cold_ttft_ms", median(s.cold_ms)},
                         {"warm_ttft_ms", median(s.warm_ms)},
                         {"speedup", median(s.cold_ms) / median(s.warm_ms)},
                         {"restored_tokens", s.restored},
                         {"prefix_cache_tokens", s.tokens_held},
                         {"prefix_cache_bytes", s.bytes},
                         {"prefix_cache_bytes_fp16", s.bytes_dense}});
    }
    nlohmann::json out = {{"model", flags.model_dir},
                          {"threads", flags.threads},
                          {"prefix_tokens", flags.prefix_tokens},
                          {"question_tokens", flags.question_tokens},
                          {"repeats", flags.repeats},
                          {"kv", describe_kv(quant)},
                          {"results", results},
                          {"bytes_ratio", bytes_ratio}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("prefix %d tokens + question %d tokens, %d threads, medians of %d runs; KV: %s\n",
              flags.prefix_tokens, flags.question_tokens, flags.threads, flags.repeats,
              describe_kv(quant).c_str());
  std::printf("%-12s %13s %13s %8s %9s %8s %13s %13s\n", "kv", "cold TTFT ms", "warm TTFT ms",
              "speedup", "restored", "held", "cache bytes", "fp16 bytes");
  for (const Side& s : sides) {
    std::printf("%-12s %13.1f %13.1f %7.1fx %9lld %8lld %13zu %13zu\n", s.name.c_str(),
                median(s.cold_ms), median(s.warm_ms), median(s.cold_ms) / median(s.warm_ms),
                static_cast<long long>(s.restored), static_cast<long long>(s.tokens_held), s.bytes,
                s.bytes_dense);
  }
  std::printf("prefix cache bytes, %s / dense: %.3fx\n", sides[1].name.c_str(), bytes_ratio);
  return 0;
}

}  // namespace turbokv::cli
