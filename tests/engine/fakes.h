// Test doubles for scheduling behaviour: a tiny "model" whose next token is a hash of the whole
// token history held in its caches, caches that just remember token ids, and a tokenizer that
// maps ids to short strings. They make batching mistakes (wrong positions, mixed-up caches,
// lost tokens) visible as different outputs.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace turbokv::testing {

inline constexpr int kFakeVocab = 16;
inline constexpr int32_t kFakeEos = 0;
inline constexpr int32_t kPoisonToken = 15;  // FakeModel::forward throws when fed this

// Remembers the token ids appended (carried in k[0]); nbytes counts 2 bytes per K/V element.
// Its state is its kind, its rows the token ids: sessions and the prefix cache copy them.
class TokenCache : public KVCache {
 public:
  std::string type_name() const override { return "token-cache"; }
  int kv_heads() const override { return 1; }
  int head_dim() const override { return 4; }
  int64_t size() const override { return static_cast<int64_t>(tokens.size()); }
  void append(const float* k, const float*, int n_tokens) override {
    for (int i = 0; i < n_tokens; ++i) tokens.push_back(static_cast<int32_t>(k[i * 4]));
  }
  void trim(int64_t n) override { tokens.resize(tokens.size() - n); }
  size_t nbytes() const override { return tokens.size() * 4 * 2 * 2; }
  void attend(const float*, int, const AttentionParams&, float*) const override {}
  int64_t calibration_tokens() const override { return 0; }
  void write_state(ByteWriter& out) const override;
  void read_state(ByteReader& in) override;
  void write_rows(ByteWriter& out, int64_t first, int64_t n) const override;
  void read_rows(ByteReader& in, int64_t n) override;

  std::vector<int32_t> tokens;
};

// The next token after a history: never the poison token (whose logit is -1e9, so that sampling
// does not pick it either); EOS when the hash says so.
int32_t fake_next_token(const std::vector<int32_t>& history);

// vocab > kFakeVocab pads the vocabulary past FakeTokenizer's, as checkpoints with padded
// embedding rows do; the padded ids then get the highest logits of all.
class FakeModel : public Model {
 public:
  explicit FakeModel(int64_t context = 4096, int vocab = kFakeVocab);
  const ModelInfo& info() const override { return info_; }
  std::vector<LayerSpec> layer_specs() const override;
  void forward(std::span<const Chunk> chunks) const override;

  // Chunk sizes of every forward call, in order.
  std::vector<std::vector<int>> calls() const;
  // Each forward call sleeps this long (requests that stay active while a test acts).
  void set_delay(std::chrono::microseconds delay) { delay_us_ = delay.count(); }

 private:
  ModelInfo info_;
  std::atomic<int64_t> delay_us_{0};
  mutable std::mutex mu_;
  mutable std::vector<std::vector<int>> calls_;
};

LayerCaches make_token_caches(const ResolvedKV&);

// id 0 = "<eos>" (special); 1..9 = "a".."i"; 10 = "END"; 11 = "xy"; 12 = " "; 13 = "\n";
// 14 = "E"; 15 = "!".
class FakeTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int vocab_size() const override { return kFakeVocab; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::string id_to_token(int32_t id) const override;
  bool is_special(int32_t id) const override { return id == kFakeEos; }
  const TokenizerConfig& config() const override { return config_; }

 private:
  TokenizerConfig config_;
};

}  // namespace turbokv::testing
