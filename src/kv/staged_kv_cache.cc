#include "kv/staged_kv_cache.h"

#include "core/error.h"

namespace turbokv {

StagedKVCache::StagedKVCache(int kv_heads, int head_dim, KVDType dense_dtype,
                             int64_t quantized_kv_start, Convert convert)
    : start_(quantized_kv_start),
      convert_(std::move(convert)),
      dense_(std::make_unique<DenseKVCache>(kv_heads, head_dim, dense_dtype)) {
  if (quantized_kv_start < 1) {
    throw InvalidArgument(
        str_cat("quantized_kv_start ", quantized_kv_start, " must be >= 1 for a staged cache"));
  }
}

const KVCache& StagedKVCache::current() const {
  if (quantized_) return *quantized_;
  return *dense_;
}

KVCache& StagedKVCache::current() {
  if (quantized_) return *quantized_;
  return *dense_;
}

void StagedKVCache::append(const float* k, const float* v, int n_tokens) {
  current().append(k, v, n_tokens);
  if (!quantized_ && dense_->size() >= start_) {
    quantized_ = convert_(*dense_);
    dense_.reset();
  }
}

}  // namespace turbokv
