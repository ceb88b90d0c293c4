#include "kv/staged_kv_cache.h"

#include "core/error.h"
#include "kv/byte_io.h"

namespace turbokv {

StagedKVCache::StagedKVCache(int kv_heads, int head_dim, KVDType dense_dtype,
                             int64_t quantized_kv_start, Convert convert)
    : kv_heads_(kv_heads),
      head_dim_(head_dim),
      dense_dtype_(dense_dtype),
      start_(quantized_kv_start),
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

void StagedKVCache::save(ByteWriter& out) const {
  write_cache_header(out, "staged", kv_heads_, head_dim_);
  out.put<int64_t>(start_);
  out.put<uint8_t>(converted() ? 1 : 0);
  current().save(out);
}

void StagedKVCache::load(ByteReader& in) {
  read_cache_header(in, "staged", kv_heads_, head_dim_);
  expect_same("quantized_kv_start", in.get<int64_t>("quantized_kv_start"), start_);
  if (in.get<uint8_t>("stage") != 0) {
    if (!quantized_) quantized_ = convert_(DenseKVCache(kv_heads_, head_dim_, dense_dtype_));
    dense_.reset();
  } else if (quantized_) {
    dense_ = std::make_unique<DenseKVCache>(kv_heads_, head_dim_, dense_dtype_);
    quantized_.reset();
  }
  current().load(in);
}

}  // namespace turbokv
