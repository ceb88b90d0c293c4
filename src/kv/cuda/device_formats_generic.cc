// The formats the generic paged kernels serve (kernels/cuda/kvcache): TurboQuant at any bits,
// head_dim and split codec, with centering and sink tokens, and uniform affine groups, with
// the Hadamard rotation or without. Their blocks hold the CPU caches' rows
// (packed_rows.h records), head-major inside each 256-token block.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/kvcache/formats.h"
#include "kv/cuda/device_formats.h"
#include "kv/turboquant_kv_cache.h"
#include "kv/uniform_kv_cache.h"
#include "quant/codec.h"
#include "quant/rotation.h"

namespace turbokv::cuda {
namespace {

int64_t blocks_for(int64_t tokens) { return (tokens + kBlockTokens - 1) / kBlockTokens; }

// Copies rows between a cache's PackedRows (keys or values) and blocks [n_blocks][block_bytes]
// whose section for that tensor starts at codes_offset (codes [kv_heads][256][code_bytes]) and
// aux_offset (aux words [kv_heads][256][aux]). Row t is the token at position first_pos + t
// (the rows after the sink tokens).
void rows_to_blocks(const PackedRows& rows, int kv_heads, int64_t first_pos, size_t block_bytes,
                    size_t codes_offset, size_t aux_offset, uint8_t* blocks) {
  const size_t cb = rows.code_bytes(), aux = size_t(rows.aux_per_vector());
  for (int64_t t = 0; t < rows.rows(); ++t) {
    const int64_t p = first_pos + t;
    uint8_t* block = blocks + size_t(p / kBlockTokens) * block_bytes;
    for (int h = 0; h < kv_heads; ++h) {
      const size_t slot = size_t(h) * kBlockTokens + size_t(p % kBlockTokens);
      std::memcpy(block + codes_offset + slot * cb, rows.codes(h, t), cb);
      std::memcpy(block + aux_offset + slot * aux * 2, rows.aux(h, t), aux * 2);
    }
  }
}

void blocks_to_rows(const uint8_t* blocks, int kv_heads, int64_t first_pos, int64_t tokens,
                    size_t block_bytes, size_t codes_offset, size_t aux_offset, PackedRows& rows) {
  const size_t cb = rows.code_bytes(), aux = size_t(rows.aux_per_vector());
  const int64_t first = rows.grow(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = first_pos + t;
    const uint8_t* block = blocks + size_t(p / kBlockTokens) * block_bytes;
    for (int h = 0; h < kv_heads; ++h) {
      const size_t slot = size_t(h) * kBlockTokens + size_t(p % kBlockTokens);
      std::memcpy(rows.codes(h, first + t), block + codes_offset + slot * cb, cb);
      std::memcpy(rows.aux(h, first + t), block + aux_offset + slot * aux * 2, aux * 2);
    }
  }
}

// A cache's key and value rows as blocks, and back (Cache: TurboQuantKVCache or UniformKVCache;
// first_pos: the position of its first coded row).
template <class Cache>
std::vector<uint8_t> cache_to_blocks(const Cache& cache, int kv_heads, const BlockGeometry& g,
                                     int64_t first_pos = 0) {
  std::vector<uint8_t> blocks(size_t(blocks_for(cache.size())) * g.block_bytes);
  rows_to_blocks(cache.key_rows(), kv_heads, first_pos, g.block_bytes, g.k_offset, g.k_aux_offset,
                 blocks.data());
  rows_to_blocks(cache.value_rows(), kv_heads, first_pos, g.block_bytes, g.v_offset, g.v_aux_offset,
                 blocks.data());
  return blocks;
}

template <class Cache>
void blocks_to_cache(const std::vector<uint8_t>& blocks, int64_t first_pos, int64_t tokens,
                     int kv_heads, const BlockGeometry& g, Cache& cache) {
  blocks_to_rows(blocks.data(), kv_heads, first_pos, tokens, g.block_bytes, g.k_offset,
                 g.k_aux_offset, cache.key_rows());
  blocks_to_rows(blocks.data(), kv_heads, first_pos, tokens, g.block_bytes, g.v_offset,
                 g.v_aux_offset, cache.value_rows());
}

std::unique_ptr<quant::TurboQuantCodec> probe_codec(int head_dim, double bits,
                                                    quant::TensorRole role,
                                                    const TurboQuantKVConfig& config) {
  // A split codec in natural order: the channel orders are per sequence (TQSequenceState).
  return quant::make_turboquant_codec(turboquant_codec_config(head_dim, bits, role, config));
}

// Sink tokens (config.sink_tokens): positions below it are fp16 rows in the sequence's state
// (their block slots stay unused), as the CPU cache keeps them apart from its coded rows.
// Recent tokens (config.recent_tokens, W): every token is coded as without them; attention
// reads each query's last W positions as fp16 rows (the step's own rows, QueryRows::k_new /
// v_new, and a ring of W - 1 rows in the sequence's state that update_recent() keeps).
// Centering: the means travel in TQSequenceState; the kernels subtract them before coding and
// add them back at attention.
class GenericTQDeviceFormat final : public DeviceFormat {
 public:
  explicit GenericTQDeviceFormat(const LayerCachePlan& p)
      : kv_heads_(p.kv_heads),
        head_dim_(p.head_dim),
        config_(p.turboquant),
        key_(probe_codec(p.head_dim, config_.key_bits, quant::TensorRole::kKey, config_)),
        value_(probe_codec(p.head_dim, config_.value_bits, quant::TensorRole::kValue, config_)),
        device_(p.kv_heads, *key_, *value_),
        format_(with_levers(device_.format(), config_)),
        geometry_(block_geometry(format_)) {}

  std::string type_name() const override { return "turboquant"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  size_t block_bytes() const override { return geometry_.block_bytes; }
  size_t bytes_per_token() const override {
    return size_t(kv_heads_) * (key_->bytes_per_vector() + value_->bytes_per_vector());
  }
  bool calibrates() const override {
    return key_->norms_per_vector() > 1 || value_->norms_per_vector() > 1 || config_.center_keys ||
           config_.center_values;
  }
  int sink_tokens() const override { return config_.sink_tokens; }
  int recent_tokens() const override { return config_.recent_tokens; }
  // As TurboQuantKVCache::nbytes() between steps: coded rows, 4 bytes per element of each sink
  // token and of each recent row held (min(W - 1, coded rows)), and once calibrated 2 bytes per
  // channel per KV head for each split or centered tensor.
  size_t nbytes(int64_t tokens, bool calibrated) const override {
    const int64_t sinks = std::min<int64_t>(tokens, config_.sink_tokens);
    const int64_t recent = config_.recent_tokens > 0
                               ? std::min<int64_t>(config_.recent_tokens - 1, tokens - sinks)
                               : 0;
    const size_t hd = size_t(kv_heads_) * head_dim_;
    size_t metadata = 0;
    if (calibrated) {
      const int tensors = (key_->norms_per_vector() > 1) + (value_->norms_per_vector() > 1) +
                          config_.center_keys + config_.center_values;
      metadata = size_t(tensors) * 2 * hd;
    }
    return size_t(tokens - sinks) * bytes_per_token() + size_t(sinks + recent) * 4 * hd + metadata;
  }

  void append(const PagedBatch& batch, const TQSequenceState* states, const AppendRows& rows,
              cudaStream_t stream) const override {
    paged_append(format_, batch, states, rows, stream);
  }
  size_t workspace_bytes(const PagedBatch& batch, const QueryRows& q,
                         const AttentionOptions& o) const override {
    return paged_attention_workspace_bytes(format_, batch, q, o);
  }
  void attend(const PagedBatch& batch, const TQSequenceState* states, const QueryRows& q,
              const AttentionOptions& o, int, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) const override {
    if (config_.center_keys && o.logit_softcap > 0) {  // as the CPU cache refuses it
      throw Unsupported(
          "TurboQuant key centering needs shift-invariant scores; soft-capped attention "
          "(logit_softcap > 0) must keep keys uncentered");
    }
    paged_attention(format_, batch, states, q, o, workspace, workspace_bytes, stream);
  }
  void update_recent(const PagedBatch& batch, const TQSequenceState* states, const QueryRows& q,
                     cudaStream_t stream) const override {
    if (config_.recent_tokens > 1) paged_recent_update(format_, batch, states, q, stream);
  }

  std::unique_ptr<KVCache> host_cache() const override {
    return std::make_unique<TurboQuantKVCache>(kv_heads_, head_dim_, config_);
  }
  std::unique_ptr<KVCache> to_host(const std::vector<uint8_t>& blocks, int64_t tokens,
                                   const std::vector<std::vector<int>>& key_orders,
                                   const std::vector<std::vector<int>>& value_orders,
                                   const std::vector<uint16_t>& sinks) const override {
    auto cache = std::make_unique<TurboQuantKVCache>(kv_heads_, head_dim_, config_);
    if (!key_orders.empty() || !value_orders.empty()) {
      cache->set_channel_orders(key_orders, value_orders);
    }
    const int S = config_.sink_tokens;
    const int held = int(std::min<int64_t>(tokens, S));
    if (held > 0) {  // the sink rows first: the CPU cache keeps them as they come
      if (sinks.size() != 2 * size_t(kv_heads_) * S * head_dim_) {
        throw FormatError("device cache: sink rows of the wrong size");
      }
      const size_t row = size_t(kv_heads_) * head_dim_;
      std::vector<float> k(size_t(held) * row), v(k.size());  // [held, kv_heads, head_dim]
      for (int t = 0; t < held; ++t) {
        for (int h = 0; h < kv_heads_; ++h) {
          for (int j = 0; j < head_dim_; ++j) {
            const size_t src = (size_t(h) * S + t) * head_dim_ + j;
            k[t * row + size_t(h) * head_dim_ + j] = f16_to_f32(sinks[src]);
            v[t * row + size_t(h) * head_dim_ + j] = f16_to_f32(sinks[src + row * S]);
          }
        }
      }
      cache->append(k.data(), v.data(), held);
    }
    blocks_to_cache(blocks, held, tokens - held, kv_heads_, geometry_, *cache);
    return cache;
  }
  std::vector<uint8_t> from_host(const KVCache& host) const override {
    const auto& cache = dynamic_cast<const TurboQuantKVCache&>(host);
    return cache_to_blocks(cache, kv_heads_, geometry_, cache.sink_rows());
  }
  std::vector<uint16_t> sinks_from_host(const KVCache& host) const override {
    const int S = config_.sink_tokens;
    if (S == 0) return {};
    const auto& cache = dynamic_cast<const TurboQuantKVCache&>(host);
    const DenseKVView view = cache.sink_view();
    const size_t row = size_t(kv_heads_) * head_dim_;
    std::vector<uint16_t> sinks(2 * row * S, 0);  // [keys, values][kv_heads][S][head_dim]
    for (int64_t t = 0; t < cache.sink_rows(); ++t) {
      for (int h = 0; h < kv_heads_; ++h) {
        const size_t src = (size_t(h) * view.head_stride + t) * head_dim_;
        const size_t dst = (size_t(h) * S + t) * head_dim_;
        std::memcpy(&sinks[dst], static_cast<const uint16_t*>(view.k) + src, 2 * head_dim_);
        std::memcpy(&sinks[dst + row * S], static_cast<const uint16_t*>(view.v) + src,
                    2 * head_dim_);
      }
    }
    return sinks;
  }

 private:
  static TQFormat with_levers(TQFormat f, const TurboQuantKVConfig& config) {
    f.sink_tokens = config.sink_tokens;
    f.recent_tokens = config.recent_tokens;
    return f;
  }

  int kv_heads_, head_dim_;
  TurboQuantKVConfig config_;
  std::unique_ptr<quant::TurboQuantCodec> key_, value_;
  TQDeviceFormat device_;
  TQFormat format_;  // device_'s, with the sink and recent tokens
  BlockGeometry geometry_;
};

class UniformDeviceFormat final : public DeviceFormat {
 public:
  explicit UniformDeviceFormat(const LayerCachePlan& p)
      : kv_heads_(p.kv_heads),
        head_dim_(p.head_dim),
        config_(p.uniform),
        key_({p.head_dim, p.uniform.key_bits, p.uniform.group_size}),
        value_({p.head_dim, p.uniform.value_bits, p.uniform.group_size}),
        rotated_(p.uniform.hadamard ? rotated(p, key_, value_) : nullptr),
        format_(rotated_ ? rotated_->format() : make_uniform_format(p.kv_heads, key_, value_)),
        geometry_(block_geometry(format_)) {}

  std::string type_name() const override { return "uniform"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return head_dim_; }
  size_t block_bytes() const override { return geometry_.block_bytes; }
  size_t bytes_per_token() const override {
    return size_t(kv_heads_) * (key_.bytes_per_vector() + value_.bytes_per_vector());
  }

  void append(const PagedBatch& batch, const TQSequenceState*, const AppendRows& rows,
              cudaStream_t stream) const override {
    paged_append(format_, batch, rows, stream);
  }
  size_t workspace_bytes(const PagedBatch& batch, const QueryRows& q,
                         const AttentionOptions& o) const override {
    return paged_attention_workspace_bytes(batch, q, o, kv_heads_, head_dim_);
  }
  void attend(const PagedBatch& batch, const TQSequenceState*, const QueryRows& q,
              const AttentionOptions& o, int, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) const override {
    paged_attention(format_, batch, q, o, workspace, workspace_bytes, stream);
  }

  std::unique_ptr<KVCache> host_cache() const override {
    return std::make_unique<UniformKVCache>(kv_heads_, head_dim_, config_);
  }
  std::unique_ptr<KVCache> to_host(const std::vector<uint8_t>& blocks, int64_t tokens,
                                   const std::vector<std::vector<int>>&,
                                   const std::vector<std::vector<int>>&,
                                   const std::vector<uint16_t>&) const override {
    auto cache = std::make_unique<UniformKVCache>(kv_heads_, head_dim_, config_);
    blocks_to_cache(blocks, 0, tokens, kv_heads_, geometry_, *cache);
    return cache;
  }
  std::vector<uint8_t> from_host(const KVCache& host) const override {
    return cache_to_blocks(dynamic_cast<const UniformKVCache&>(host), kv_heads_, geometry_);
  }

 private:
  // The uniform cache's rotations (quant/rotation.h, keys and values of the seed).
  static std::unique_ptr<RotatedUniformFormat> rotated(const LayerCachePlan& p,
                                                       const quant::UniformCodec& key,
                                                       const quant::UniformCodec& value) {
    const auto rk = quant::Rotation::get(p.uniform.seed, p.head_dim, quant::RotationRole::kKey);
    const auto rv = quant::Rotation::get(p.uniform.seed, p.head_dim, quant::RotationRole::kValue);
    return std::make_unique<RotatedUniformFormat>(p.kv_heads, key, value, *rk, *rv);
  }

  int kv_heads_, head_dim_;
  UniformKVConfig config_;
  quant::UniformCodec key_, value_;
  std::unique_ptr<RotatedUniformFormat> rotated_;  // hadamard on
  UniformFormat format_;
  BlockGeometry geometry_;
};

}  // namespace

std::shared_ptr<const DeviceFormat> make_generic_turboquant_format(const LayerCachePlan& plan) {
  return std::make_shared<GenericTQDeviceFormat>(plan);
}

std::shared_ptr<const DeviceFormat> make_generic_uniform_format(const LayerCachePlan& plan) {
  return std::make_shared<UniformDeviceFormat>(plan);
}

}  // namespace turbokv::cuda
