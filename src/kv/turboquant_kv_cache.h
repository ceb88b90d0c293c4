// TurboQuantKVCache (docs/design.md, "TurboQuant"): keys and values stored as TurboQuant codes
// (src/quant codecs) plus fp16 norms; attention runs on the codes (kernels/cpu/attention_codes.h).
//  - integer bits: one MSE codec per tensor, shared by all KV heads;
//  - k + 0.5 bits: a split codec per KV head, its channel order ranked by mean |x| over the
//    first chunk the cache sees (kept as cache state and saved with it).
// Every appended token goes through the codec, the fresh tokens of a chunk included (the
// conservative path: decode and perplexity see the same K/V).
#pragma once

#include <memory>
#include <vector>

#include "kernels/cpu/attention_codes.h"
#include "kv/dense_kv_cache.h"
#include "kv/packed_rows.h"
#include "quant/codec.h"

namespace turbokv {

struct TurboQuantKVConfig {
  double key_bits = 3;    // multiple of 0.5 in [1, 8]
  double value_bits = 4;  // multiple of 0.5 in [1, 8]
  uint64_t seed = 0;
  bool norm_correction = true;
};

class TurboQuantKVCache : public KVCache {
 public:
  // Throws InvalidArgument for bad dims or bits.
  TurboQuantKVCache(int kv_heads, int head_dim, const TurboQuantKVConfig& config);

  std::string type_name() const override { return "turboquant"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  int64_t size() const override { return keys_.rows.rows(); }
  void append(const float* k, const float* v, int n_tokens) override;
  void trim(int64_t n) override;
  // Codes + norms of every token, plus the split channel orders (2 bytes per channel per KV
  // head, once the first chunk has fixed them).
  size_t nbytes() const override;
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  // State: bits, seed, norm correction, the split channel orders and the tokens they were
  // ranked on. Rows: codes and norms.
  void write_state(ByteWriter& out) const override;
  void read_state(ByteReader& in) override;
  void write_rows(ByteWriter& out, int64_t first, int64_t n) const override;
  void read_rows(ByteReader& in, int64_t n) override;
  // With a split codec: the size of the first chunk, on which the channel orders were ranked.
  int64_t calibration_tokens() const override { return calibrated_on_; }

  const TurboQuantKVConfig& config() const { return config_; }
  // Bytes one token of one KV head takes (keys and values, codes and norms).
  size_t bytes_per_token_head() const;
  // True once the codecs exist (for split bits: after the first non-empty append).
  bool calibrated() const { return !keys_.codecs.empty(); }
  // [kv_heads][head_dim] channel orders of a split key / value codec (empty otherwise).
  std::vector<std::vector<int>> key_channel_orders() const { return keys_.channel_orders(); }
  std::vector<std::vector<int>> value_channel_orders() const { return values_.channel_orders(); }
  // Fixes the split channel orders (as when loading a saved cache); only before any append.
  void set_channel_orders(const std::vector<std::vector<int>>& key_orders,
                          const std::vector<std::vector<int>>& value_orders);

  // Costly: a dequantized f32 copy of the whole cache (tests compare against it).
  DenseKVCache to_dense() const;
  // Costly: quantizes every token of a dense cache in one step (quantized_kv_start).
  static std::unique_ptr<TurboQuantKVCache> convert_from(const DenseKVCache& dense,
                                                         const TurboQuantKVConfig& config);

  TurboQuantKVView view() const;
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
    bool split() const;
    std::vector<std::vector<int>> channel_orders() const;
  };
  void make_codecs(Tensor& tensor, const float* first_chunk, int n_tokens,
                   const std::vector<std::vector<int>>* orders);
  void encode(Tensor& tensor, const float* x, int n_tokens, int64_t first_row);

  int kv_heads_;
  int head_dim_;
  TurboQuantKVConfig config_;
  Tensor keys_, values_;
  int64_t calibrated_on_ = 0;  // tokens the split channel orders were ranked on (0: none)
};

}  // namespace turbokv
