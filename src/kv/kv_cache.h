// The KV cache interface: the model hands each layer's new K/V to its cache and asks the cache
// for attention; it never knows how keys are stored. Cache types (dense, rotating, uniform,
// TurboQuant) implement this and pick their attention kernels (src/kernels/cpu).
//
// Layouts (row-major, fp32, post-RoPE):
//   k, v  : [n_tokens, kv_heads, head_dim]
//   q, out: [n_queries, n_heads, head_dim], n_heads a multiple of kv_heads (GQA)
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "turbokv/kv_options.h"

namespace turbokv {

class ByteWriter;
class ByteReader;

// What the cache policy needs to know about one attention layer.
struct LayerSpec {
  int kv_heads = 0;
  int head_dim = 0;
  int sliding_window = 0;  // 0: global attention; W > 0: a query at p sees keys in (p - W, p]
};

// AttentionParams (n_heads, scale, logit_softcap, sliding_window) lives with the kernels:
// kernels/cpu/attention.h.

class KVCache {
 public:
  virtual ~KVCache() = default;

  virtual std::string type_name() const = 0;  // "dense-f16", "rotating", "uniform", "turboquant"
  virtual int kv_heads() const = 0;
  virtual int head_dim() const = 0;
  // Logical positions held: the position the next appended token gets.
  virtual int64_t size() const = 0;

  // Appends n tokens at positions size() .. size()+n-1. Throws InvalidArgument on bad shapes.
  virtual void append(const float* k, const float* v, int n_tokens) = 0;
  // Drops the newest n tokens.
  virtual void trim(int64_t n) = 0;
  // Exact bytes of stored state (codes, norms, scales, split metadata).
  virtual size_t nbytes() const = 0;

  // Attention for n_q queries at the last n_q positions appended (causal, plus the sliding
  // window of params). out may not alias q.
  virtual void attend(const float* q, int n_q, const AttentionParams& params, float* out) const = 0;

  // Save/load of the whole state (kv/cache_file.h). save() writes the cache's kind, its
  // configuration and its tokens. load() checks kind and configuration against this cache
  // (InvalidArgument naming the field that differs), then replaces its state; FormatError for
  // malformed data. The defaults throw Unsupported.
  virtual void save(ByteWriter& out) const;
  virtual void load(ByteReader& in);

  // append() for callers that know the shape of k and v: throws InvalidArgument naming the
  // mismatch when kv_heads or head_dim differ from the cache's, or n_tokens < 0.
  void append_checked(const float* k, const float* v, int n_tokens, int kv_heads, int head_dim);

 protected:
  // Throws InvalidArgument unless 0 <= n_tokens and k, v are non-null when n_tokens > 0.
  void check_append(const float* k, const float* v, int n_tokens) const;
  // Throws InvalidArgument unless 1 <= n_q <= size(), n_heads is a positive multiple of
  // kv_heads(), and the sliding window is not negative.
  void check_attend(const float* q, int n_q, const AttentionParams& params, const float* out) const;
};

// Throws InvalidArgument unless 1 <= kv_heads <= 1024 and 1 <= head_dim <= 1024.
void check_kv_shape(int kv_heads, int head_dim);

// One sequence's caches, one per layer.
using LayerCaches = std::vector<std::unique_ptr<KVCache>>;

}  // namespace turbokv
