// Shape checks shared by every cache type (user-input tier: typed errors with messages).
#include "kv/kv_cache.h"

#include "core/error.h"

namespace turbokv {

void check_kv_shape(int kv_heads, int head_dim) {
  if (kv_heads < 1 || kv_heads > 1024) {
    throw InvalidArgument(str_cat("kv_heads ", kv_heads, " is out of range (1..1024)"));
  }
  if (head_dim < 1 || head_dim > 1024) {
    throw InvalidArgument(str_cat("head_dim ", head_dim, " is out of range (1..1024)"));
  }
}

void KVCache::save(ByteWriter&) const {
  throw Unsupported(str_cat("a ", type_name(), " cache cannot be saved"));
}

void KVCache::load(ByteReader&) {
  throw Unsupported(str_cat("a ", type_name(), " cache cannot be loaded"));
}

void KVCache::append_checked(const float* k, const float* v, int n_tokens, int kv_heads,
                             int head_dim) {
  if (kv_heads != this->kv_heads() || head_dim != this->head_dim()) {
    throw InvalidArgument(str_cat("K/V of shape [", n_tokens, ", ", kv_heads, ", ", head_dim,
                                  "] do not fit a ", type_name(), " cache of [tokens, ",
                                  this->kv_heads(), ", ", this->head_dim(), "]"));
  }
  append(k, v, n_tokens);
}

void KVCache::check_append(const float* k, const float* v, int n_tokens) const {
  if (n_tokens < 0) throw InvalidArgument(str_cat("n_tokens ", n_tokens, " is negative"));
  if (n_tokens > 0 && (k == nullptr || v == nullptr)) {
    throw InvalidArgument("append: k and v must not be null");
  }
}

void KVCache::check_attend(const float* q, int n_q, const AttentionParams& params,
                           const float* out) const {
  if (n_q < 1 || n_q > size()) {
    throw InvalidArgument(
        str_cat("attend: n_q ", n_q, " is not in 1..", size(), " (the tokens held)"));
  }
  if (params.n_heads < 1 || params.n_heads % kv_heads() != 0) {
    throw InvalidArgument(str_cat("attend: n_heads ", params.n_heads,
                                  " is not a positive multiple of kv_heads ", kv_heads()));
  }
  if (params.sliding_window < 0) {
    throw InvalidArgument(str_cat("attend: sliding_window ", params.sliding_window, " < 0"));
  }
  if (q == nullptr || out == nullptr) throw InvalidArgument("attend: q and out must not be null");
}

}  // namespace turbokv
