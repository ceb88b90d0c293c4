// Flags shared by generate, chat and server: the model, device, threads, KV options and the
// sampling options, and loading an Engine from them (with progress on a TTY).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "core/threads.h"
#include "turbokv/engine.h"

namespace turbokv::cli {

inline bool stderr_is_tty() {
  return isatty(fileno(stderr)) != 0;
}

struct EngineFlags {
  std::string model = default_model_dir();
  std::string device = "cpu";
  int threads = 0;
  KVFlags kv;

  void add_to(CLI::App& app) {
    app.add_option("--model", model, "model directory (default: the shipped tinycode-llama)");
    app.add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--threads", threads, "worker threads (default: all cores)");
    kv.add_to(app);
  }

  // Validates the flags, then loads the model (a progress line on a TTY).
  std::unique_ptr<Engine> load(EngineOptions options = {}) const {
    if (device == "cuda") {
      throw InvalidArgument(
          "--device cuda: this build runs models on the CPU only (the CUDA kernels are not "
          "wired into the model yet); use --device cpu");
    }
    options.kv = kv.options();
    if (threads != 0) set_num_threads(threads);
    const bool tty = stderr_is_tty();
    if (tty) std::fprintf(stderr, "loading %s ...", model.c_str());
    const auto start = std::chrono::steady_clock::now();
    auto engine = Engine::load(model, options);
    if (tty) {
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "\rloaded %s in %.2f s\n", model.c_str(), s);
    }
    return engine;
  }
};

struct SamplingFlags {
  int max_tokens = 256;
  SamplingOptions sampling;
  std::vector<std::string> stop;

  void add_to(CLI::App& app) {
    app.add_option("--max-tokens", max_tokens, "tokens to generate at most");
    app.add_option("--temperature", sampling.temperature, "0 (default): greedy");
    app.add_option("--top-p", sampling.top_p, "nucleus sampling mass in (0, 1]");
    app.add_option("--top-k", sampling.top_k, "keep the k most likely tokens (0: off)");
    app.add_option("--min-p", sampling.min_p, "drop tokens below min-p times the best (0: off)");
    app.add_option("--repetition-penalty", sampling.repetition_penalty, "1: off");
    app.add_option("--seed", sampling.seed, "sampling seed");
    app.add_option("--stop", stop, "stop string (repeatable)");
  }

  GenerateOptions options() const {
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.sampling = sampling;
    o.stop = stop;
    return o;
  }
};

// Prints "prefill 256/1000" on a TTY while a long prompt is processed; clears it when the
// first token (or the end) arrives.
class PrefillProgress {
 public:
  explicit PrefillProgress(int64_t prompt_tokens)
      : total_(prompt_tokens), enabled_(stderr_is_tty()) {}
  void update(const GenerationChunk& chunk) {
    if (chunk.token >= 0 || chunk.done) {
      clear();
      return;
    }
    if (!enabled_ || chunk.prompt_processed >= total_) return;
    std::fprintf(stderr, "\rprefill %lld/%lld", static_cast<long long>(chunk.prompt_processed),
                 static_cast<long long>(total_));
    shown_ = true;
  }

 private:
  void clear() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

  int64_t total_;
  bool enabled_;
  bool shown_ = false;
};

}  // namespace turbokv::cli
