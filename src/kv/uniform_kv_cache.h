// UniformKVCache: keys and values stored with the uniform affine group codec (the baseline
// scheme, quant/codec_uniform.h): per group of group_size elements b-bit integers plus an fp16
// scale and min. Attention decodes one tile of codes at a time (kernels/cpu/attention_codes.h).
// With hadamard on, every vector is first rotated by the TurboQuant rotation of its role
// (quant/rotation.h: keys R_k, values R_v, from the seed) and the rotated vector is grouped;
// attention rotates the queries by R_k (scores are unchanged: <R_k q, R_k k> = <q, k>) and takes
// the output back with R_v^T. The rotation is not stored: the bytes are those of plain groups.
#pragma once

#include <memory>

#include "kernels/cpu/attention_codes.h"
#include "kv/dense_kv_cache.h"
#include "kv/packed_rows.h"
#include "quant/rotation.h"

namespace turbokv {

struct UniformKVConfig {
  int key_bits = 4;     // 2..8
  int value_bits = 4;   // 2..8
  int group_size = 64;  // 32, 64 or 128
  bool hadamard = false;
  uint64_t seed = 0;  // of the rotations (hadamard on)
};

class UniformKVCache : public KVCache {
 public:
  // Throws InvalidArgument for bad dims, bits or group size.
  UniformKVCache(int kv_heads, int head_dim, const UniformKVConfig& config);

  std::string type_name() const override { return "uniform"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  int64_t size() const override { return keys_.rows(); }
  void append(const float* k, const float* v, int n_tokens) override;
  void trim(int64_t n) override;
  // Codes + fp16 (scale, min) per group, keys and values.
  size_t nbytes() const override { return keys_.nbytes() + values_.nbytes(); }
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  // State: bits and group size. Rows: codes and each group's fp16 (scale, min).
  void write_state(ByteWriter& out) const override;
  void read_state(ByteReader& in) override;
  void write_rows(ByteWriter& out, int64_t first, int64_t n) const override;
  void read_rows(ByteReader& in, int64_t n) override;
  int64_t calibration_tokens() const override { return 0; }

  const UniformKVConfig& config() const { return config_; }
  size_t bytes_per_token_head() const {
    return key_codec_.bytes_per_vector() + value_codec_.bytes_per_vector();
  }
  // Costly: a dequantized f32 copy of the whole cache.
  DenseKVCache to_dense() const;
  // Costly: quantizes every token of a dense cache in one step (quantized_kv_start).
  static std::unique_ptr<UniformKVCache> convert_from(const DenseKVCache& dense,
                                                      const UniformKVConfig& config);

  UniformKVView view() const;
  PackedRows& key_rows() { return keys_; }
  PackedRows& value_rows() { return values_; }
  const PackedRows& key_rows() const { return keys_; }
  const PackedRows& value_rows() const { return values_; }

 private:
  void encode(const quant::UniformCodec& codec, const quant::Rotation* rotation, PackedRows& rows,
              const float* x, int n_tokens, int64_t first_row);

  int kv_heads_;
  int head_dim_;
  UniformKVConfig config_;
  quant::UniformCodec key_codec_, value_codec_;
  std::shared_ptr<const quant::Rotation> key_rotation_, value_rotation_;  // hadamard on
  PackedRows keys_, values_;
};

}  // namespace turbokv
