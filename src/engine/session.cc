// SessionImpl and model_fingerprint (engine/session.h).
#include "engine/session.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/scheduler.h"

namespace turbokv {

SessionImpl::SessionImpl(const void* owner, const ResolvedKV& kv, std::vector<LayerSpec> layers)
    : owner_(owner), kv_(kv), layers_(std::move(layers)) {}

std::vector<int32_t> SessionImpl::tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_;
}

int64_t SessionImpl::cached_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return caches_.empty() ? 0 : caches_.front()->size();
}

size_t SessionImpl::kv_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t bytes = 0;
  for (const auto& c : caches_) bytes += c->nbytes();
  return bytes;
}

size_t SessionImpl::kv_bytes_dense() const {
  return dense_kv_bytes(layers_, cached_tokens());
}

bool SessionImpl::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

std::string SessionImpl::metadata() const {
  std::lock_guard<std::mutex> lock(mu_);
  return metadata_;
}

void SessionImpl::set_metadata(std::string text) {
  std::lock_guard<std::mutex> lock(mu_);
  metadata_ = std::move(text);
}

void SessionImpl::check_idle(const char* what) const {
  if (busy_) {
    throw InvalidArgument(
        str_cat("the session is in use by a running request; it can be ", what, " when it ends"));
  }
}

void SessionImpl::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  check_idle("cleared");
  caches_.clear();
  tokens_.clear();
}

void SessionImpl::acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_) throw InvalidArgument("the session is in use by another request");
  busy_ = true;
}

void SessionImpl::take(LayerCaches* caches, std::vector<int32_t>* tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  *caches = std::move(caches_);
  *tokens = std::move(tokens_);
  caches_.clear();
  tokens_.clear();
}

void SessionImpl::release(LayerCaches caches, std::vector<int32_t> tokens, bool keep) {
  std::lock_guard<std::mutex> lock(mu_);
  if (keep) {
    caches_ = std::move(caches);
    tokens_ = std::move(tokens);
  } else {
    caches_.clear();
    tokens_.clear();
  }
  busy_ = false;
}

void SessionImpl::release_untaken() {
  std::lock_guard<std::mutex> lock(mu_);
  busy_ = false;
}

void SessionImpl::install(LayerCaches caches, std::vector<int32_t> tokens, std::string metadata) {
  std::lock_guard<std::mutex> lock(mu_);
  caches_ = std::move(caches);
  tokens_ = std::move(tokens);
  metadata_ = std::move(metadata);
}

namespace {

// FNV-1a over bytes, folded into a running 64-bit state.
void hash_into(uint64_t* h, const uint8_t* data, size_t n) {
  uint64_t x = *h;
  for (size_t i = 0; i < n; ++i) x = (x ^ data[i]) * 0x100000001B3ull;
  *h = x;
}

void hash_value(uint64_t* h, uint64_t v) {
  hash_into(h, reinterpret_cast<const uint8_t*>(&v), sizeof(v));
}

void hash_whole_file(uint64_t* h, const std::filesystem::path& path) {
  const MappedFile file(path.string());
  hash_value(h, file.size());
  hash_into(h, file.data(), file.size());
}

void hash_weight_file(uint64_t* h, const std::filesystem::path& path) {
  constexpr size_t kHead = size_t(1) << 20, kWindow = 4096, kWindows = 64;
  const MappedFile file(path.string());
  const std::string name = path.filename().string();
  hash_into(h, reinterpret_cast<const uint8_t*>(name.data()), name.size());
  hash_value(h, file.size());
  const size_t head = std::min(kHead, file.size());
  hash_into(h, file.data(), head);
  if (file.size() <= head + kWindow) {
    hash_into(h, file.data() + head, file.size() - head);
    return;
  }
  const size_t span = file.size() - head - kWindow;
  for (size_t i = 0; i < kWindows; ++i) {
    hash_into(h, file.data() + head + span / (kWindows - 1) * i, kWindow);
  }
}

bool is_weight_file(const std::filesystem::path& path) {
  return path.extension() == ".safetensors" || path.extension() == ".gguf";
}

}  // namespace

uint64_t model_fingerprint(const std::string& path) {
  namespace fs = std::filesystem;
  uint64_t h = 0xCBF29CE484222325ull;
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    hash_weight_file(&h, path);
    return h;
  }
  for (const char* name : {"config.json", "tokenizer.json"}) {
    const fs::path file = fs::path(path) / name;
    if (fs::is_regular_file(file, error)) hash_whole_file(&h, file);
  }
  std::vector<fs::path> weights;
  for (const auto& entry : fs::directory_iterator(path, error)) {
    if (entry.is_regular_file(error) && is_weight_file(entry.path()))
      weights.push_back(entry.path());
  }
  if (error) throw IoError(str_cat("cannot list the model directory '", path, "'"));
  std::sort(weights.begin(), weights.end());
  for (const auto& file : weights) hash_weight_file(&h, file);
  return h;
}

}  // namespace turbokv
