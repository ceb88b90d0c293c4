// Shape checks shared by every cache type (user-input tier: typed errors with messages), and
// save/load/copy_rows/append_rows built on each type's write_state and write_rows.
#include "kv/kv_cache.h"

#include "core/error.h"
#include "kv/byte_io.h"

namespace turbokv {

const char* layer_state_kind_name(LayerStateKind kind) {
  switch (kind) {
    case LayerStateKind::kAttention:
      return "attention";
    case LayerStateKind::kRecurrent:
      return "recurrent";
    case LayerStateKind::kLatent:
      return "latent";
    case LayerStateKind::kShared:
      return "shared";
  }
  return "?";
}

void check_kv_shape(int kv_heads, int head_dim) {
  if (kv_heads < 1 || kv_heads > 1024) {
    throw InvalidArgument(str_cat("kv_heads ", kv_heads, " is out of range (1..1024)"));
  }
  if (head_dim < 1 || head_dim > 1024) {
    throw InvalidArgument(str_cat("head_dim ", head_dim, " is out of range (1..1024)"));
  }
}

void KVCache::write_state(ByteWriter&) const {
  throw Unsupported(str_cat("a ", type_name(), " cache cannot be saved or copied"));
}

void KVCache::read_state(ByteReader&) {
  throw Unsupported(str_cat("a ", type_name(), " cache cannot be loaded or restored"));
}

void KVCache::write_rows(ByteWriter&, int64_t, int64_t) const {
  throw Unsupported(str_cat("a ", type_name(), " cache cannot be saved or copied"));
}

void KVCache::read_rows(ByteReader&, int64_t) {
  throw Unsupported(str_cat("a ", type_name(), " cache cannot be loaded or restored"));
}

void KVCache::save(ByteWriter& out) const {
  write_state(out);
  out.put<int64_t>(size());
  write_rows(out, 0, size());
}

void KVCache::load(ByteReader& in) {
  read_state(in);
  const int64_t n = in.get<int64_t>("token count");
  if (n < 0 || n > kMaxFileTokens) {
    throw FormatError(str_cat("cache file: token count ", n, " is not in 0..", kMaxFileTokens));
  }
  read_rows(in, n);
}

std::shared_ptr<const KVRows> KVCache::copy_rows(int64_t first, int64_t n) const {
  ByteWriter out;
  write_rows(out, first, n);
  std::vector<uint8_t> bytes = out.take();
  bytes.shrink_to_fit();
  return std::make_shared<const KVRowBytes>(n, std::move(bytes));
}

void KVCache::append_rows(const KVRows& rows) {
  const auto* copy = dynamic_cast<const KVRowBytes*>(&rows);
  if (copy == nullptr) {
    throw InvalidArgument(
        str_cat("append_rows: a ", type_name(), " cache takes rows copied by a CPU cache"));
  }
  ByteReader in(copy->bytes().data(), copy->bytes().size());
  read_rows(in, copy->tokens());
  if (in.remaining() != 0) {
    throw InvalidArgument(str_cat("append_rows: ", in.remaining(), " bytes of the ", copy->tokens(),
                                  " rows are left over: rows of another cache"));
  }
}

void KVCache::check_rows(int64_t first, int64_t n) const {
  if (first < 0 || n < 0 || first + n > size()) {
    throw InvalidArgument(
        str_cat("rows [", first, ", ", first + n, ") are not in a cache of ", size(), " tokens"));
  }
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
