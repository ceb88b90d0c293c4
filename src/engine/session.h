// The engine's Session (turbokv/engine.h): a sequence's caches and token history parked between
// requests, owned by the session while idle and by the engine thread while a request runs on
// it. Also the model identity recorded in session files.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "turbokv/engine.h"

namespace turbokv {

class SessionImpl final : public Session {
 public:
  // owner: the scheduler whose requests may use it.
  SessionImpl(const void* owner, const ResolvedKV& kv, std::vector<LayerSpec> layers);

  std::vector<int32_t> tokens() const override;
  int64_t cached_tokens() const override;
  size_t kv_bytes() const override;
  size_t kv_bytes_dense() const override;
  const ResolvedKV& kv() const override { return kv_; }
  bool busy() const override;
  std::string metadata() const override;
  void set_metadata(std::string text) override;
  void clear() override;

  const void* owner() const { return owner_; }
  // Marks the session busy; InvalidArgument when it already is.
  void acquire();
  // Hands the caches and tokens to the request that acquired it.
  void take(LayerCaches* caches, std::vector<int32_t>* tokens);
  // Ends a request: keeps its caches and token history (tokens[0, caches' size) are in the
  // caches), or forgets everything when the caches may be half-written (keep = false).
  void release(LayerCaches caches, std::vector<int32_t> tokens, bool keep);
  // Ends a request that never took the caches.
  void release_untaken();

  // Under the lock, and only while not busy: the caches for saving; InvalidArgument when busy.
  template <typename Fn>
  void with_idle(Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    check_idle("saved");
    fn(static_cast<const LayerCaches&>(caches_), static_cast<const std::vector<int32_t>&>(tokens_),
       static_cast<const std::string&>(metadata_));
  }
  // Installs loaded state (a session nobody uses yet).
  void install(LayerCaches caches, std::vector<int32_t> tokens, std::string metadata);

 private:
  void check_idle(const char* what) const;

  const void* owner_;
  ResolvedKV kv_;
  std::vector<LayerSpec> layers_;
  mutable std::mutex mu_;
  bool busy_ = false;
  LayerCaches caches_;           // empty: none yet
  std::vector<int32_t> tokens_;  // the history; caches_ hold its first tokens
  std::string metadata_;
};

// Identity of the model in dir: a 64-bit hash of config.json, tokenizer.json, and for every
// weight file (*.safetensors, *.gguf) its name, size, first MiB (the headers) and 64 windows of
// 4 KiB spread over the rest, so that another checkpoint of the same architecture differs.
// A path to a single weight file is hashed the same way. Throws IoError.
uint64_t model_fingerprint(const std::string& path);

}  // namespace turbokv
