// Per-sequence state of layers that hold no per-token K/V, kept in the same per-layer list as
// the KV caches so that one LayerCaches describes a whole sequence:
//   RecurrentState : a linear-attention layer's fixed-size state (short-convolution history and
//                    one [k_dim, v_dim] matrix per value head). Never quantized; cannot be
//                    trimmed (it keeps no per-token history to roll back).
//   SharedKVCache  : a KV-shared layer's view of an earlier layer's cache. It stores nothing,
//                    so the owner's K/V are held (and compressed) once.
#pragma once

#include <vector>

#include "kv/kv_cache.h"

namespace turbokv {

class RecurrentState final : public KVCache {
 public:
  // Throws InvalidArgument for a non-positive size.
  explicit RecurrentState(const RecurrentShape& shape);

  std::string type_name() const override { return "recurrent"; }
  int kv_heads() const override { return 0; }
  int head_dim() const override { return 0; }
  // Tokens consumed so far (the next token's position).
  int64_t size() const override { return tokens_; }
  // No K/V rows: throws Unsupported (the model updates the state through conv()/state()).
  void append(const float* k, const float* v, int n_tokens) override;
  // trim(0) is a no-op; dropping tokens throws Unsupported: the state is a function of every
  // token consumed and keeps no history to roll back.
  void trim(int64_t n) override;
  size_t nbytes() const override { return 0; }
  size_t state_bytes() const override { return (conv_.size() + state_.size()) * sizeof(float); }
  // Throws Unsupported: linear attention reads the state, not a cache of tokens.
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  // No rows to copy: write_state/copy_rows keep their Unsupported defaults, so a sequence with
  // a recurrent state is not saved to cache files or shared through the prefix cache.
  int64_t calibration_tokens() const override { return 0; }

  const RecurrentShape& shape() const { return shape_; }
  float* conv() { return conv_.data(); }    // [conv_history, conv_channels], oldest first
  float* state() { return state_.data(); }  // [heads, k_dim, v_dim]
  // Records that n more tokens were folded into the state.
  void advance(int64_t n) { tokens_ += n; }

 private:
  RecurrentShape shape_;
  int64_t tokens_ = 0;
  std::vector<float> conv_;
  std::vector<float> state_;
};

class SharedKVCache final : public KVCache {
 public:
  // owner must outlive this view (both live in the same LayerCaches).
  explicit SharedKVCache(const KVCache* owner, int owner_layer)
      : owner_(owner), owner_layer_(owner_layer) {}

  std::string type_name() const override { return "shared"; }
  int kv_heads() const override { return owner_->kv_heads(); }
  int head_dim() const override { return owner_->head_dim(); }
  int64_t size() const override { return owner_->size(); }
  // Throws Unsupported: a shared layer never writes K/V.
  void append(const float* k, const float* v, int n_tokens) override;
  // No-op: the owner's own trim drops the tokens.
  void trim(int64_t) override {}
  size_t nbytes() const override { return 0; }
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override {
    owner_->attend(q, n_q, params, out);
  }
  int64_t calibration_tokens() const override { return owner_->calibration_tokens(); }

  const KVCache& owner() const { return *owner_; }
  int owner_layer() const { return owner_layer_; }

 private:
  const KVCache* owner_;
  int owner_layer_;
};

}  // namespace turbokv
