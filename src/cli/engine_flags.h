// Flags shared by generate, chat and server: the model, device, threads, KV options, the prefix
// cache budget and the sampling options, and loading an Engine from them (with progress on a
// TTY); --prompt-cache FILE of generate and chat.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
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
  DeviceFlags device;
  int threads = 0;
  double prefix_cache_gb = -1;
  KVFlags kv;

  void add_to(CLI::App& app) {
    app.add_option("--model", model, "model directory (default: the shipped tinycode-llama)");
    device.add_to(app);
    app.add_option("--threads", threads, "worker threads (default: all cores)")
        ->check(integer_in(0, 1024));
    app.add_option("--prefix-cache-gb", prefix_cache_gb,
                   "memory of the automatic prefix cache in GiB (0: off; default: a tenth of the "
                   "RAM, at most 8)");
    kv.add_to(app);
  }

  // Validates the flags, then loads the model (a progress line on a TTY).
  std::unique_ptr<Engine> load(EngineOptions options = {}) const {
    const DeviceOptions d = device.options();
    options.device = d.device;
    options.kv_cache_gb = d.kv_cache_gb;
    options.batch_invariant = d.batch_invariant;
    options.kv = kv.options();
    if (prefix_cache_gb != -1) {
      if (!(prefix_cache_gb >= 0 && prefix_cache_gb <= 1 << 20)) {
        throw InvalidArgument(
            str_cat("--prefix-cache-gb ", prefix_cache_gb, " is not a size in GiB (0: off)"));
      }
      options.prefix_cache_bytes = static_cast<int64_t>(prefix_cache_gb * double(1 << 30));
    }
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
    app.add_option("--seed", sampling.seed, "sampling seed")->check(unsigned_integer());
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

// --prompt-cache FILE (generate, chat): the session saved in FILE when it exists, which must
// belong to the same model and KV settings (else a clear error, never a silent reprefill), or
// a new one; save() writes it back.
class PromptCache {
 public:
  PromptCache(Engine& engine, std::string path, const KVOptions& kv)
      : engine_(engine), path_(std::move(path)) {
    if (!path_.empty() && std::filesystem::exists(path_)) {
      session_ = engine.load_session(path_, kv);
      loaded_ = true;
    } else {
      session_ = engine.new_session(kv);
    }
  }
  Session& session() { return *session_; }
  const std::shared_ptr<Session>& shared() const { return session_; }
  bool loaded() const { return loaded_; }
  void save() {
    if (!path_.empty()) engine_.save_session(*session_, path_);
  }

 private:
  Engine& engine_;
  std::string path_;
  std::shared_ptr<Session> session_;
  bool loaded_ = false;
};

}  // namespace turbokv::cli
