// StagedKVCache: quantized_kv_start (docs/design.md, "Cache policy"). Holds a DenseKVCache until it
// has N tokens, then converts the whole history in one step (the convert function, e.g.
// TurboQuantKVCache::convert_from) and forwards everything to the quantized cache after.
#pragma once

#include <functional>
#include <memory>

#include "kv/dense_kv_cache.h"

namespace turbokv {

class StagedKVCache : public KVCache {
 public:
  using Convert = std::function<std::unique_ptr<KVCache>(const DenseKVCache&)>;

  // quantized_kv_start >= 1; convert builds the quantized cache from the dense history.
  StagedKVCache(int kv_heads, int head_dim, KVDType dense_dtype, int64_t quantized_kv_start,
                Convert convert);

  // The current stage's type ("dense-f16" before the conversion, then e.g. "turboquant").
  std::string type_name() const override { return current().type_name(); }
  int kv_heads() const override { return current().kv_heads(); }
  int head_dim() const override { return current().head_dim(); }
  int64_t size() const override { return current().size(); }
  // Converts in this call once size() reaches quantized_kv_start.
  void append(const float* k, const float* v, int n_tokens) override;
  // After the conversion, trimming below quantized_kv_start keeps the cache quantized.
  void trim(int64_t n) override { current().trim(n); }
  size_t nbytes() const override { return current().nbytes(); }
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override {
    current().attend(q, n_q, params, out);
  }

  // State: quantized_kv_start, the stage and the tokens held at the conversion, then the
  // current stage's state. Rows: the current stage's.
  void write_state(ByteWriter& out) const override;
  void read_state(ByteReader& in) override;
  void write_rows(ByteWriter& out, int64_t first, int64_t n) const override {
    current().write_rows(out, first, n);
  }
  // Converts, as append() does, once the dense stage reaches quantized_kv_start.
  void read_rows(ByteReader& in, int64_t n) override;
  // After the conversion: the tokens held then (earlier tokens were attended to in the dense
  // stage, later ones in the quantized one); before it, those of the dense stage (0).
  int64_t calibration_tokens() const override;

  bool converted() const { return quantized_ != nullptr; }
  int64_t quantized_kv_start() const { return start_; }
  const KVCache& current() const;
  KVCache& current();

 private:
  int kv_heads_;
  int head_dim_;
  KVDType dense_dtype_;
  int64_t start_;
  Convert convert_;
  void convert_if_due();

  std::unique_ptr<DenseKVCache> dense_;
  std::unique_ptr<KVCache> quantized_;
  int64_t converted_at_ = 0;  // tokens held at the conversion
};

}  // namespace turbokv
