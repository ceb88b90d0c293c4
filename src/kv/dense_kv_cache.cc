#include "kv/dense_kv_cache.h"

#include <algorithm>

#include "core/error.h"
#include "kv/byte_io.h"

namespace turbokv {
DenseKVCache::DenseKVCache(int kv_heads, int head_dim, KVDType dtype)
    : kv_heads_(kv_heads), head_dim_(head_dim), rows_(dtype, kv_heads, head_dim) {
  check_kv_shape(kv_heads, head_dim);
}

std::string DenseKVCache::type_name() const {
  return std::string("dense-") + kv_dtype_name(rows_.dtype());
}

void DenseKVCache::append(const float* k, const float* v, int n_tokens) {
  check_append(k, v, n_tokens);
  rows_.append(k, v, n_tokens);
}

void DenseKVCache::copy_tokens(int64_t first, int64_t n, std::vector<float>* k,
                               std::vector<float>* v) const {
  if (first < 0 || n < 0 || first + n > size()) {
    throw InvalidArgument(
        str_cat("copy_tokens(", first, ", ", n, ") on a cache of ", size(), " tokens"));
  }
  const size_t row = static_cast<size_t>(kv_heads_) * head_dim_;
  k->resize(row * n);
  v->resize(row * n);
  rows_.read_f32(first, n, k->data(), v->data());
}

void DenseKVCache::trim(int64_t n) {
  if (n < 0 || n > size()) {
    throw InvalidArgument(str_cat("trim(", n, ") on a cache of ", size(), " tokens"));
  }
  rows_.drop_newest(n);
}

void DenseKVCache::attend(const float* q, int n_q, const AttentionParams& params,
                          float* out) const {
  check_attend(q, n_q, params, out);
  attention_dense(view(), AttentionQueries{q, n_q, size() - n_q}, params, out);
}

void DenseKVCache::write_state(ByteWriter& out) const {
  write_cache_header(out, "dense", kv_heads_, head_dim_);
  out.string(kv_dtype_name(dtype()));
}

void DenseKVCache::read_state(ByteReader& in) {
  read_cache_header(in, "dense", kv_heads_, head_dim_);
  expect_same("dense dtype", in.string("dtype"), std::string(kv_dtype_name(dtype())));
  rows_.drop_newest(rows_.rows());
}

void DenseKVCache::write_rows(ByteWriter& out, int64_t first, int64_t n) const {
  check_rows(first, n);
  rows_.write(out, first, n);
}

void DenseKVCache::read_rows(ByteReader& in, int64_t n) {
  rows_.read_append(in, n);
}

RotatingKVCache::RotatingKVCache(int kv_heads, int head_dim, int window, KVDType dtype)
    : kv_heads_(kv_heads), head_dim_(head_dim), window_(window), rows_(dtype, kv_heads, head_dim) {
  check_kv_shape(kv_heads, head_dim);
  if (window < 1) {
    throw InvalidArgument(str_cat("sliding window ", window, " must be >= 1"));
  }
}

void RotatingKVCache::append(const float* k, const float* v, int n_tokens) {
  check_append(k, v, n_tokens);
  const int64_t keep = window_ - 1;
  if (rows_.rows() + n_tokens > rows_.capacity() && rows_.rows() > keep) {
    rows_.drop_oldest(rows_.rows() - keep);
  }
  rows_.append(k, v, n_tokens);
  size_ += n_tokens;
}

void RotatingKVCache::trim(int64_t n) {
  if (n < 0 || n > size_) {
    throw InvalidArgument(str_cat("trim(", n, ") on a cache of ", size_, " tokens"));
  }
  const int64_t held_after = rows_.rows() - n;
  if (held_after < std::min<int64_t>(size_ - n, window_ - 1)) {
    throw Unsupported(str_cat("trim(", n, ") on a sliding-window cache holding ", rows_.rows(),
                              " positions would need positions evicted earlier (window ", window_,
                              ")"));
  }
  rows_.drop_newest(n);
  size_ -= n;
}

void RotatingKVCache::attend(const float* q, int n_q, const AttentionParams& params,
                             float* out) const {
  check_attend(q, n_q, params, out);
  if (params.sliding_window != 0 && params.sliding_window != window_) {
    throw InvalidArgument(str_cat("sliding_window ", params.sliding_window,
                                  " differs from the cache's window ", window_));
  }
  AttentionParams windowed = params;
  windowed.sliding_window = window_;
  attention_dense(view(), AttentionQueries{q, n_q, size_ - n_q}, windowed, out);
}

void RotatingKVCache::write_state(ByteWriter& out) const {
  write_cache_header(out, "rotating", kv_heads_, head_dim_);
  out.string(kv_dtype_name(dtype()));
  out.put<int32_t>(window_);
}

void RotatingKVCache::read_state(ByteReader& in) {
  read_cache_header(in, "rotating", kv_heads_, head_dim_);
  expect_same("rotating dtype", in.string("dtype"), std::string(kv_dtype_name(dtype())));
  expect_same("sliding window", in.get<int32_t>("window"), window_);
  rows_.drop_newest(rows_.rows());
  size_ = 0;
}

void RotatingKVCache::write_rows(ByteWriter& out, int64_t first, int64_t n) const {
  check_rows(first, n);
  const int64_t first_held = size_ - rows_.rows();
  if (first < first_held) {
    throw InvalidArgument(str_cat("rows from position ", first,
                                  " of a sliding-window cache: positions before ", first_held,
                                  " were evicted (window ", window_, ")"));
  }
  rows_.write(out, first - first_held, n);
}

void RotatingKVCache::read_rows(ByteReader& in, int64_t n) {
  rows_.read_append(in, n);
  size_ += n;
}

void RotatingKVCache::save(ByteWriter& out) const {
  write_state(out);
  out.put<int64_t>(size_);
  out.put<int64_t>(rows_.rows());
  write_rows(out, size_ - rows_.rows(), rows_.rows());
}

void RotatingKVCache::load(ByteReader& in) {
  read_state(in);
  const int64_t size = in.get<int64_t>("positions");
  const int64_t held = in.get<int64_t>("positions held");
  if (size < 0 || size > kMaxFileTokens || held < 0 || held > size ||
      held < std::min<int64_t>(size, window_ - 1)) {
    throw FormatError(str_cat("cache file: rotating cache of ", size, " positions holding ", held,
                              " is out of range"));
  }
  size_ = size - held;
  read_rows(in, held);
}

}  // namespace turbokv
