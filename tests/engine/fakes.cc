// Test doubles for the scheduler tests (see fakes.h).
#include "fakes.h"

#include <thread>

#include "core/error.h"
#include "kv/byte_io.h"

namespace turbokv::testing {
namespace {

const char* const kPieces[kFakeVocab] = {"<eos>", "a", "b",   "c",  "d", "e",  "f", "g",
                                         "h",     "i", "END", "xy", " ", "\n", "E", "!"};

}  // namespace

void TokenCache::write_state(ByteWriter& out) const {
  out.string(type_name());
}

void TokenCache::read_state(ByteReader& in) {
  expect_same("cache type", in.string("cache type"), type_name());
  tokens.clear();
}

void TokenCache::write_rows(ByteWriter& out, int64_t first, int64_t n) const {
  check_rows(first, n);
  out.bytes(tokens.data() + first, size_t(n) * sizeof(int32_t));
}

void TokenCache::read_rows(ByteReader& in, int64_t n) {
  const size_t old = tokens.size();
  tokens.resize(old + size_t(n));
  in.bytes(tokens.data() + old, size_t(n) * sizeof(int32_t), "token ids");
}

int32_t fake_next_token(const std::vector<int32_t>& history) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < history.size(); ++i) {
    h = (h ^ static_cast<uint64_t>(history[i] + 31 * i)) * 1099511628211ULL;
  }
  return static_cast<int32_t>((h >> 29) % (kFakeVocab - 1));  // 0..14: never the poison token
}

FakeModel::FakeModel(int64_t context, int vocab) {
  info_.model_type = "fake";
  info_.vocab_size = vocab;
  info_.num_layers = 2;
  info_.num_heads = 1;
  info_.num_kv_heads = 1;
  info_.head_dim = 4;
  info_.max_position_embeddings = context;
  info_.eos_token_ids = {kFakeEos};
}

std::vector<LayerSpec> FakeModel::layer_specs() const {
  return {LayerSpec{1, 4, 0}, LayerSpec{1, 4, 0}};
}

void FakeModel::forward(std::span<const Chunk> chunks) const {
  if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_.load()));
  std::vector<int> sizes;
  for (const auto& c : chunks) {
    sizes.push_back(c.n_tokens);
    for (int i = 0; i < c.n_tokens; ++i) {
      if (c.tokens[i] == kPoisonToken) throw Error("fake model: poison token");
    }
  }
  for (const auto& c : chunks) {
    for (auto& cache : *c.caches) {
      std::vector<float> k(c.n_tokens * 4, 0.0f), v(c.n_tokens * 4, 0.0f);  // [n, 1, 4]
      for (int i = 0; i < c.n_tokens; ++i) k[i * 4] = static_cast<float>(c.tokens[i]);
      cache->append(k.data(), v.data(), c.n_tokens);
    }
    const auto& history = static_cast<const TokenCache&>(*c.caches->front()).tokens;
    // The padded ids score highest; the poison token is never a sensible draw.
    for (int i = 0; i < info_.vocab_size; ++i) c.logits[i] = i < kFakeVocab ? 0.0f : 20.0f;
    c.logits[kPoisonToken] = -1e9f;
    c.logits[fake_next_token(history)] = 10.0f;
  }
  std::lock_guard<std::mutex> lock(mu_);
  calls_.push_back(std::move(sizes));
}

std::vector<std::vector<int>> FakeModel::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

LayerCaches make_token_caches(const ResolvedKV&) {
  LayerCaches caches;
  caches.push_back(std::make_unique<TokenCache>());
  caches.push_back(std::make_unique<TokenCache>());
  return caches;
}

std::vector<int32_t> FakeTokenizer::encode(std::string_view text, bool) const {
  std::vector<int32_t> ids;
  for (char ch : text) {
    auto id = token_to_id(std::string_view(&ch, 1));
    if (!id) throw InvalidArgument("fake tokenizer: no token for this character");
    ids.push_back(*id);
  }
  return ids;
}

std::string FakeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    out += kPieces[id];
  }
  return out;
}

std::optional<int32_t> FakeTokenizer::token_to_id(std::string_view token) const {
  for (int i = 0; i < kFakeVocab; ++i) {
    if (token == kPieces[i]) return i;
  }
  return std::nullopt;
}

std::string FakeTokenizer::id_to_token(int32_t id) const {
  return kPieces[id];
}

}  // namespace turbokv::testing
