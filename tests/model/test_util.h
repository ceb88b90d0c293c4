// Helpers shared by the model tests: fixture paths, reading reference tensors, a plain f32
// KV cache with a naive attention (independent of src/kv) for golden runs.
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace turbokv::testing {

inline std::string fixture(const std::string& rel) {
  return std::string(TURBOKV_SOURCE_DIR) + "/tests/fixtures/" + rel;
}
inline std::string repo_path(const std::string& rel) {
  return std::string(TURBOKV_SOURCE_DIR) + "/" + rel;
}

// Exact f32 storage; attention in double with a two-pass softmax, causal + sliding window +
// soft-cap, GQA by head / (n_heads / kv_heads).
class NaiveKVCache final : public KVCache {
 public:
  NaiveKVCache(int kv_heads, int head_dim) : kv_heads_(kv_heads), head_dim_(head_dim) {}
  std::string type_name() const override { return "naive-f32"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  int64_t size() const override { return int64_t(k_.size()) / (kv_heads_ * head_dim_); }
  void append(const float* k, const float* v, int n) override {
    k_.insert(k_.end(), k, k + int64_t(n) * kv_heads_ * head_dim_);
    v_.insert(v_.end(), v, v + int64_t(n) * kv_heads_ * head_dim_);
  }
  void trim(int64_t n) override {
    k_.resize(size_t((size() - n) * kv_heads_ * head_dim_));
    v_.resize(k_.size());
  }
  size_t nbytes() const override { return (k_.size() + v_.size()) * sizeof(float); }
  void attend(const float* q, int n_q, const AttentionParams& p, float* out) const override {
    const int64_t n_k = size(), group = p.n_heads / kv_heads_, d = head_dim_;
    for (int i = 0; i < n_q; ++i) {
      const int64_t pos = n_k - n_q + i;
      for (int h = 0; h < p.n_heads; ++h) {
        const int64_t kvh = h / group;
        const float* qv = q + (int64_t(i) * p.n_heads + h) * d;
        std::vector<double> s(size_t(pos + 1), -INFINITY);
        double max = -INFINITY;
        for (int64_t t = 0; t <= pos; ++t) {
          if (p.sliding_window > 0 && t <= pos - p.sliding_window) continue;
          const float* kv = k_.data() + (t * kv_heads_ + kvh) * d;
          double dot = 0;
          for (int64_t j = 0; j < d; ++j) dot += double(qv[j]) * kv[j];
          dot *= p.scale;
          if (p.logit_softcap > 0) dot = p.logit_softcap * std::tanh(dot / p.logit_softcap);
          s[size_t(t)] = dot;
          max = std::max(max, dot);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - max));
        float* o = out + (int64_t(i) * p.n_heads + h) * d;
        for (int64_t j = 0; j < d; ++j) {
          double acc = 0;
          for (int64_t t = 0; t <= pos; ++t) acc += s[size_t(t)] * v_[size_t((t * kv_heads_ + kvh) * d + j)];
          o[j] = float(acc / sum);
        }
      }
    }
  }

 private:
  int kv_heads_, head_dim_;
  std::vector<float> k_, v_;  // [tokens, kv_heads, head_dim]
};

inline LayerCaches naive_caches(const Model& model) {
  LayerCaches caches;
  for (const LayerSpec& s : model.layer_specs()) {
    caches.push_back(std::make_unique<NaiveKVCache>(s.kv_heads, s.head_dim));
  }
  return caches;
}

}  // namespace turbokv::testing
