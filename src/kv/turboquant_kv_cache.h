// TurboQuantKVCache (docs/design.md, "TurboQuant"): keys and values stored as TurboQuant codes
// (src/quant codecs) plus fp16 norms; attention runs on the codes (kernels/cpu/attention_codes.h).
//  - integer bits: one MSE codec per tensor, shared by all KV heads;
//  - k + 0.5 bits: a split codec per KV head, its channel order ranked by mean |x - mu| over the
//    first coded chunk (kept as cache state and saved with it).
// Every appended token goes through the codec, the fresh tokens of a chunk included (the
// conservative path: decode and perplexity see the same K/V).
//
// Two exact levers around the unchanged codecs (every step below is the same on every backend):
//  - Sink tokens: positions 0 .. sink_tokens-1 are stored as fp16 rows and never coded; the
//    coded rows hold positions sink_tokens, sink_tokens+1, ... Attention runs on both parts and
//    merges the two partial softmaxes by their log-sum-exp.
//  - Centering: per KV head a mean mu [head_dim] of the first coded chunk (the tokens at
//    positions >= sink_tokens of the first append() that reaches past the sinks):
//      mu_j = f32_to_f16(clamp(float(S_j / n), -65504, 65504)),  S_j = the sum over those n
//      tokens, in token order, of double(x_tj) (double additions, one double division);
//    every coded vector is c = x - f16_to_f32(mu) (fp32 subtraction per element), then the codec.
//    Keys: a score drops by scale * <q, mu_k> for every key of a query alike, so the softmax over
//    the coded keys is unchanged. Values: the coded part's output is sum_t p_t (v_t - mu_v) +
//    mu_v (sum_t p_t = 1), the kernel's output plus f16_to_f32(mu_v) per element. With sinks the
//    coded part's log-sum-exp gets scale * <q, mu_k> added back (fp32, j ascending) before the
//    merge. Soft-capped scores are not shift-invariant: key centering refuses them.
//  Means and split channel orders are fixed once and kept through trim().
//  - Recent tokens (W = recent_tokens > 0): a query at position p reads the keys and values of
//    positions max(sink_tokens, p - W + 1) .. p as fp16 rows (f32_to_f16 of the appended
//    values, uncentered) and the coded rows only up to position p - W; every token is still
//    coded as with W = 0 (codes, norms and means do not change). The three parts (coded,
//    recent, sinks) are merged by log-sum-exp. The cache holds the fp16 rows of positions
//    >= max(sink_tokens, size() - (W - 1)) between steps; append() adds those of the chunk
//    (held until the chunk's queries have attended), attend() drops rows no later query can
//    read. A prefix of such a cache is not exact (the window's rows of its last positions are
//    gone): trim() and write_rows() of a range that does not end at size() throw Unsupported
//    when W > 1.
#pragma once

#include <memory>
#include <vector>

#include "kernels/cpu/attention_codes.h"
#include "kv/dense_kv_cache.h"
#include "kv/packed_rows.h"
#include "quant/codec.h"

namespace turbokv {

constexpr int kMaxSinkTokens = 65536;
constexpr int kMaxRecentTokens = 1024;

struct TurboQuantKVConfig {
  double key_bits = 3;    // multiple of 0.5 in [1, 8]
  double value_bits = 4;  // multiple of 0.5 in [1, 8]
  uint64_t seed = 0;
  bool norm_correction = true;
  bool unbiased_norm = false;  // stored norms n / <y, C[idx]> (quant/codec_mse.h step 5)
  bool center_keys = false;    // subtract the per-head key mean before coding
  bool center_values = false;  // subtract the per-head value mean before coding
  int sink_tokens = 0;         // the first positions kept as fp16 rows (0..kMaxSinkTokens)
  int recent_tokens =
      0;  // W: each query's last W positions read as fp16 rows (0..kMaxRecentTokens)
};

// The codec settings of one tensor (keys or values) of such a cache: its bits, the cache's seed
// and norm correction. Device caches build their codecs from the same settings.
quant::TurboQuantConfig turboquant_codec_config(int head_dim, double bits, quant::TensorRole role,
                                                const TurboQuantKVConfig& config);

// The stored-norm rule as one byte (cache state and files): 0 plain, 1 norm correction,
// 2 unbiased.
uint8_t norm_mode_byte(const TurboQuantKVConfig& config);

class TurboQuantKVCache : public KVCache {
 public:
  // Throws InvalidArgument for bad dims or bits.
  TurboQuantKVCache(int kv_heads, int head_dim, const TurboQuantKVConfig& config);

  std::string type_name() const override { return "turboquant"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  int64_t size() const override { return sinks_.rows() + keys_.rows.rows(); }
  void append(const float* k, const float* v, int n_tokens) override;
  void trim(int64_t n) override;
  // Codes + norms of every coded token, 4 bytes per element of each fp16 sink token (keys and
  // values), and once the first coded chunk has fixed them: the means (2 bytes per channel per
  // KV head per centered tensor) and the split channel orders (the same per split tensor), and
  // 4 bytes per element of each recent row held.
  size_t nbytes() const override;
  // Throws Unsupported for soft-capped scores with centered keys, and with recent_tokens > 0
  // when the recent rows the queries need are gone (each chunk's queries attend once, after
  // its append).
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  // State: bits, seed, norm mode (norm_mode_byte), centering, sink tokens, recent tokens (when
  // > 0), the means, the split channel orders and the tokens they were estimated on. Rows: fp16
  // sink rows, then codes and norms, then (recent_tokens > 1, a range ending at size() only) the
  // fp16 rows of the last min(recent_tokens - 1, coded) positions.
  void write_state(ByteWriter& out) const override;
  void read_state(ByteReader& in) override;
  void write_rows(ByteWriter& out, int64_t first, int64_t n) const override;
  void read_rows(ByteReader& in, int64_t n) override;
  // With a split codec or centering: the tokens up to the end of the first coded chunk, on
  // which the channel orders and means were estimated.
  int64_t calibration_tokens() const override { return calibrated_on_; }

  const TurboQuantKVConfig& config() const { return config_; }
  // Bytes one coded token of one KV head takes (keys and values, codes and norms).
  size_t bytes_per_token_head() const;
  // True once the codecs and means exist (split bits or centering: after the first coded chunk).
  bool calibrated() const { return keys_.ready && values_.ready; }
  // [kv_heads * head_dim] fp16 bits of the key / value means (empty when not centered or not
  // calibrated yet).
  const std::vector<uint16_t>& key_means() const { return keys_.mean; }
  const std::vector<uint16_t>& value_means() const { return values_.mean; }
  // Tokens held as fp16 sink rows (min(size(), sink_tokens)) and as codes.
  int64_t sink_rows() const { return sinks_.rows(); }
  int64_t coded_rows() const { return keys_.rows.rows(); }
  // [kv_heads][head_dim] channel orders of a split key / value codec (empty otherwise).
  std::vector<std::vector<int>> key_channel_orders() const { return keys_.channel_orders(); }
  std::vector<std::vector<int>> value_channel_orders() const { return values_.channel_orders(); }
  // The state append() fixes from n_tokens tokens [n_tokens, kv_heads, head_dim] at positions
  // first_pos.. (first_pos tokens held before them), without storing or coding the tokens: the
  // device caches hold the rows and take the means and orders from here. A no-op once
  // calibrated or while the tokens are all sink tokens; only on an empty cache.
  void calibrate_from(const float* k, const float* v, int n_tokens, int64_t first_pos);
  // Fixes the split channel orders (as when loading a saved cache); only before any append.
  void set_channel_orders(const std::vector<std::vector<int>>& key_orders,
                          const std::vector<std::vector<int>>& value_orders);

  // Costly: a dequantized f32 copy of the whole cache (tests compare against it).
  DenseKVCache to_dense() const;
  // Costly: quantizes every token of a dense cache in one step (quantized_kv_start).
  static std::unique_ptr<TurboQuantKVCache> convert_from(const DenseKVCache& dense,
                                                         const TurboQuantKVConfig& config);

  // The coded rows (positions sink_rows() onwards) and the fp16 sink rows (positions 0 ..).
  TurboQuantKVView view() const;
  DenseKVView sink_view() const { return sinks_.view(0); }
  // The fp16 recent rows held (recent_tokens > 0): positions recent_view().first_pos ..
  // size() - 1, never below sink_tokens.
  int64_t recent_rows() const { return recent_.rows(); }
  DenseKVView recent_view() const { return recent_.view(size() - recent_.rows()); }
  // Replaces the held recent rows by rows ([keys, values][kv_heads][n][head_dim] fp16 bits) of
  // positions size() - n .. size() - 1 (device caches' to_host); n must be
  // min(recent_tokens - 1, coded_rows()). InvalidArgument otherwise.
  void set_recent_rows(const std::vector<uint16_t>& rows, int64_t n);
  // Raw state for save/load (kv/cache_file.cc): [kv_heads, capacity, ...] rows.
  PackedRows& key_rows() { return keys_.rows; }
  PackedRows& value_rows() { return values_.rows; }
  const PackedRows& key_rows() const { return keys_.rows; }
  const PackedRows& value_rows() const { return values_.rows; }

 private:
  struct Tensor {
    // Validates bits (InvalidArgument) and sizes the rows from a probe codec.
    Tensor(int kv_heads, int head_dim, double bits, quant::TensorRole role,
           const TurboQuantKVConfig& config);
    double bits = 0;
    quant::TensorRole role = quant::TensorRole::kKey;
    std::vector<std::unique_ptr<quant::TurboQuantCodec>> codecs;  // [1] or [kv_heads] (split)
    std::vector<const quant::TurboQuantCodec*> per_head;          // [kv_heads]
    PackedRows rows;
    bool centered = false;
    bool ready = false;           // codecs and means fixed
    std::vector<uint16_t> mean;   // [kv_heads, head_dim] fp16 bits (centered, once ready)
    std::vector<float> mean_f32;  // [kv_heads, head_dim] the same as f32
    bool split() const;
    bool needs_calibration() const { return split() || centered; }
    std::vector<std::vector<int>> channel_orders() const;
  };
  // Fixes the means (centered) and then the split channel orders (ranked on x - mu) from the
  // first coded chunk x [n_tokens, kv_heads, head_dim].
  void calibrate(Tensor& tensor, const float* first_chunk, int n_tokens);
  void make_codecs(Tensor& tensor, const float* first_chunk, int n_tokens,
                   const std::vector<std::vector<int>>* orders);
  void set_means(Tensor& tensor, std::vector<uint16_t> mean);
  void encode(Tensor& tensor, const float* x, int n_tokens, int64_t first_row);
  // The coded rows' attention, mu_v added; lse [n_q, n_heads] when not null, shifted back by
  // scale * <q, mu_k> (the log-sum-exp of the uncentered scores).
  void attend_coded(const AttentionQueries& queries, const AttentionParams& params, float* out,
                    float* lse) const;
  // recent_tokens > 0: recent rows, coded rows up to p - W and sink rows, merged.
  void attend_with_recent(const AttentionQueries& queries, const AttentionParams& params,
                          float* out) const;
  // The recent rows kept between steps: min(recent_tokens - 1, coded_rows()).
  int64_t held_recent_rows() const;

  int kv_heads_;
  int head_dim_;
  TurboQuantKVConfig config_;
  Tensor keys_, values_;
  DenseRows sinks_;  // [kv_heads, <= sink_tokens, head_dim] fp16
  // [kv_heads, rows, head_dim] fp16 rows of the last positions (recent_tokens > 0); attend()
  // drops the ones no later query reads.
  mutable DenseRows recent_;
  int64_t calibrated_on_ = 0;  // tokens up to the end of the first coded chunk (0: none)
};

}  // namespace turbokv
