// Dense KV caches: DenseKVCache keeps every position (f32, f16 or bf16); RotatingKVCache keeps
// a sliding window of positions for sliding-window layers and is never quantized.
#pragma once

#include <vector>

#include "kv/dense_rows.h"
#include "kv/kv_cache.h"

namespace turbokv {

class DenseKVCache : public KVCache {
 public:
  DenseKVCache(int kv_heads, int head_dim, KVDType dtype = KVDType::kF16);

  std::string type_name() const override;  // "dense-f32", "dense-f16", "dense-bf16"
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  int64_t size() const override { return rows_.rows(); }
  void append(const float* k, const float* v, int n_tokens) override;
  void trim(int64_t n) override;
  size_t nbytes() const override { return rows_.nbytes(); }
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  // State: the element type. Rows: keys and values as stored (f32, f16 or bf16).
  void write_state(ByteWriter& out) const override;
  void read_state(ByteReader& in) override;
  void write_rows(ByteWriter& out, int64_t first, int64_t n) const override;
  void read_rows(ByteReader& in, int64_t n) override;
  int64_t calibration_tokens() const override { return 0; }

  KVDType dtype() const { return rows_.dtype(); }
  DenseKVView view() const { return rows_.view(0); }
  // Costly: tokens [first, first + n) as f32, k and v resized to [n, kv_heads, head_dim].
  void copy_tokens(int64_t first, int64_t n, std::vector<float>* k, std::vector<float>* v) const;
  const DenseRows& rows() const { return rows_; }

 private:
  int kv_heads_;
  int head_dim_;
  DenseRows rows_;
};

// Sliding-window cache: a query at p sees keys in (p - W, p]. Before appending a chunk it drops
// positions no query of the chunk can see (all but the newest W - 1), lazily, when the buffer
// must grow; so a chunk longer than W is held whole until the next append and every query in
// it sees its full window.
class RotatingKVCache : public KVCache {
 public:
  RotatingKVCache(int kv_heads, int head_dim, int window, KVDType dtype = KVDType::kF16);

  std::string type_name() const override { return "rotating"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  int64_t size() const override { return size_; }
  void append(const float* k, const float* v, int n_tokens) override;
  // Throws Unsupported when the dropped tokens leave fewer than W - 1 older positions held
  // (they were evicted earlier and cannot be brought back).
  void trim(int64_t n) override;
  // Bytes of the positions held (between W - 1 and W - 1 + the last chunks' tokens).
  size_t nbytes() const override { return rows_.nbytes(); }
  // params.sliding_window must be 0 (use the cache's) or equal to window().
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  // State: element type and window. Rows exist only for the positions held (the newest ones):
  // write_rows() of evicted positions is an InvalidArgument, read_rows() appends at size().
  void write_state(ByteWriter& out) const override;
  void read_state(ByteReader& in) override;
  void write_rows(ByteWriter& out, int64_t first, int64_t n) const override;
  void read_rows(ByteReader& in, int64_t n) override;
  int64_t calibration_tokens() const override { return 0; }
  // The record holds the position count and the rows of the positions held.
  void save(ByteWriter& out) const override;
  void load(ByteReader& in) override;

  int window() const { return window_; }
  KVDType dtype() const { return rows_.dtype(); }
  // Positions size() - view().n_tokens .. size() - 1.
  DenseKVView view() const { return rows_.view(size_ - rows_.rows()); }

 private:
  int kv_heads_;
  int head_dim_;
  int window_;
  int64_t size_ = 0;
  DenseRows rows_;
};

}  // namespace turbokv
