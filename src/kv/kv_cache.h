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

// What a layer keeps per sequence; the cache policy maps each kind to a cache type.
enum class LayerStateKind : uint8_t {
  kAttention,  // softmax attention: K/V of every token (global) or of a window (sliding)
  kRecurrent,  // linear attention: a fixed-size recurrent state (RecurrentState), no tokens
  kLatent,     // multi-head latent attention: one compressed latent row per token, kept dense
  kShared,     // reads the cache of layer shared_with (KV sharing); stores nothing itself
};
const char* layer_state_kind_name(LayerStateKind kind);  // "attention", "recurrent", ...

// Sizes of a linear-attention layer's recurrent state (kRecurrent).
struct RecurrentShape {
  int conv_channels = 0;  // channels of the short causal convolution
  int conv_history = 0;   // past inputs it keeps per channel (kernel size - 1)
  int heads = 0;          // value heads; each has a [k_dim, v_dim] state matrix
  int k_dim = 0;
  int v_dim = 0;
};

// What the cache policy needs to know about one layer.
struct LayerSpec {
  int kv_heads = 0;
  int head_dim = 0;
  int sliding_window = 0;  // 0: global attention; W > 0: a query at p sees keys in (p - W, p]
  LayerStateKind kind = LayerStateKind::kAttention;
  int shared_with = -1;        // kShared: the earlier layer whose cache this layer reads
  RecurrentShape recurrent{};  // kRecurrent
  float logit_softcap = 0;     // > 0: soft-capped scores (not shift-invariant)
};

// AttentionParams (n_heads, scale, logit_softcap, sliding_window) lives with the kernels:
// kernels/cpu/attention.h.

// An immutable run of a cache's tokens in stored form (KVCache::copy_rows). The prefix cache
// holds these and hands them to append_rows() of new sequences. nbytes() is the memory the
// piece keeps alive.
class KVRows {
 public:
  virtual ~KVRows() = default;
  virtual int64_t tokens() const = 0;
  virtual size_t nbytes() const = 0;
};

// The CPU form: a private copy of the tokens' rows, as write_rows() records them.
class KVRowBytes final : public KVRows {
 public:
  KVRowBytes(int64_t tokens, std::vector<uint8_t> bytes)
      : tokens_(tokens), bytes_(std::move(bytes)) {}
  int64_t tokens() const override { return tokens_; }
  size_t nbytes() const override { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  int64_t tokens_;
  std::vector<uint8_t> bytes_;  // write_rows() of the tokens
};

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
  // Exact bytes of stored K/V (codes, norms, scales, split metadata).
  virtual size_t nbytes() const = 0;
  // Bytes of fixed-size per-sequence state that does not grow with the tokens (a
  // linear-attention recurrent state); counted apart from nbytes().
  virtual size_t state_bytes() const { return 0; }

  // Attention for n_q queries at the last n_q positions appended (causal, plus the sliding
  // window of params). out may not alias q.
  virtual void attend(const float* q, int n_q, const AttentionParams& params, float* out) const = 0;

  // --- Copies of the stored state: cache files, sessions and the prefix cache ---
  // A cache's stored state is its *state* plus its *rows*:
  //  - the state: kind, shape, configuration, and whatever the cache estimated from the tokens
  //    it saw (split channel orders, ...): all a cache of the same configuration needs to code
  //    and attend to new tokens exactly as this one does;
  //  - the rows of tokens [first, first + n): their stored form (codes and norms, group scales,
  //    dense elements), meaningful only under that state.
  // write_state() records the state; read_state() checks kind and configuration against this
  // cache (InvalidArgument naming the field that differs), then empties the cache and installs
  // the recorded state. write_rows() records tokens [first, first + n) (InvalidArgument outside
  // the tokens held); read_rows() appends n recorded tokens at size(). FormatError for malformed
  // data. The defaults throw Unsupported: such a cache cannot be saved, restored or shared.
  virtual void write_state(ByteWriter& out) const;
  virtual void read_state(ByteReader& in);
  virtual void write_rows(ByteWriter& out, int64_t first, int64_t n) const;
  virtual void read_rows(ByteReader& in, int64_t n);

  // Tokens whose values fixed the data-dependent part of the state: the cache's first
  // calibration_tokens() tokens, appended in the chunks it saw them in, determine its state (a
  // split codec's channel order ranked on the first chunk, a conversion at quantized_kv_start).
  // 0: no such state (yet); the rows of a token depend on that token and the configuration
  // alone. Rows copied from this cache are exact for another sequence only if that sequence
  // shares these first tokens, fed in the same chunks (engine/prefix_cache.h relies on it).
  // A cache type that estimates anything from the tokens must report it here.
  virtual int64_t calibration_tokens() const = 0;

  // One record of the whole state (kv/cache_file.h): write_state(), the token count, then the
  // rows of every token; load() reads such a record into this cache.
  virtual void save(ByteWriter& out) const;
  virtual void load(ByteReader& in);

  // Costly (a copy of the rows): tokens [first, first + n) as an immutable piece that
  // append_rows() of a cache in the same state accepts. The prefix cache keeps these; a cache
  // whose storage can be shared (a paged device pool) may return a reference instead.
  virtual std::shared_ptr<const KVRows> copy_rows(int64_t first, int64_t n) const;
  // Appends the tokens of rows at size(); the cache must be in the state the rows were taken
  // under (read_state() of the source's state).
  virtual void append_rows(const KVRows& rows);

  // append() for callers that know the shape of k and v: throws InvalidArgument naming the
  // mismatch when kv_heads or head_dim differ from the cache's, or n_tokens < 0.
  void append_checked(const float* k, const float* v, int n_tokens, int kv_heads, int head_dim);

 protected:
  // Throws InvalidArgument unless 0 <= n_tokens and k, v are non-null when n_tokens > 0.
  void check_append(const float* k, const float* v, int n_tokens) const;
  // Throws InvalidArgument unless 1 <= n_q <= size(), n_heads is a positive multiple of
  // kv_heads(), and the sliding window is not negative.
  void check_attend(const float* q, int n_q, const AttentionParams& params, const float* out) const;
  // Throws InvalidArgument unless tokens [first, first + n) are held.
  void check_rows(int64_t first, int64_t n) const;
};

// Throws InvalidArgument unless 1 <= kv_heads <= 1024 and 1 <= head_dim <= 1024.
void check_kv_shape(int kv_heads, int head_dim);

// One sequence's caches, one per layer.
using LayerCaches = std::vector<std::unique_ptr<KVCache>>;

}  // namespace turbokv
