#include "kv/staged_kv_cache.h"

#include <algorithm>

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

void StagedKVCache::convert_if_due() {
  if (!quantized_ && dense_->size() >= start_) {
    converted_at_ = dense_->size();
    quantized_ = convert_(*dense_);
    dense_.reset();
  }
}

void StagedKVCache::append(const float* k, const float* v, int n_tokens) {
  current().append(k, v, n_tokens);
  convert_if_due();
}

int64_t StagedKVCache::calibration_tokens() const {
  if (!quantized_) return 0;
  return std::max(converted_at_, quantized_->calibration_tokens());
}

void StagedKVCache::write_state(ByteWriter& out) const {
  write_cache_header(out, "staged", kv_heads_, head_dim_);
  out.put<int64_t>(start_);
  out.put<uint8_t>(converted() ? 1 : 0);
  out.put<int64_t>(converted_at_);
  current().write_state(out);
}

void StagedKVCache::read_state(ByteReader& in) {
  read_cache_header(in, "staged", kv_heads_, head_dim_);
  expect_same("quantized_kv_start", in.get<int64_t>("quantized_kv_start"), start_);
  const bool converted = in.get<uint8_t>("stage") != 0;
  const int64_t converted_at = in.get<int64_t>("conversion point");
  if (converted && (converted_at < start_ || converted_at > kMaxFileTokens)) {
    throw FormatError(str_cat("cache file: a staged cache converted at ", converted_at,
                              " tokens, before its quantized_kv_start ", start_));
  }
  if (converted) {
    if (!quantized_) quantized_ = convert_(DenseKVCache(kv_heads_, head_dim_, dense_dtype_));
    dense_.reset();
  } else if (quantized_ || !dense_) {
    dense_ = std::make_unique<DenseKVCache>(kv_heads_, head_dim_, dense_dtype_);
    quantized_.reset();
  }
  converted_at_ = converted ? converted_at : 0;
  current().read_state(in);
}

void StagedKVCache::read_rows(ByteReader& in, int64_t n) {
  current().read_rows(in, n);
  convert_if_due();
}

}  // namespace turbokv
