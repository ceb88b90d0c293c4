// Device cache formats (device_formats.h).
#include "kv/cuda/device_formats.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tq_codec.h"
#include "kernels/cuda/tq_layout.h"
#include "kernels/cuda/tq_quantize.h"
#include "kv/dense_kv_cache.h"
#include "kv/turboquant_kv_cache.h"
#include "kv/uniform_kv_cache.h"

namespace turbokv::cuda {

KVDType kv_dtype_of(DenseElem elem) {
  switch (elem) {
    case DenseElem::kF32:
      return KVDType::kF32;
    case DenseElem::kF16:
      return KVDType::kF16;
    case DenseElem::kBF16:
      return KVDType::kBF16;
  }
  return KVDType::kF16;
}

namespace {

int64_t blocks_for(int64_t tokens) {
  return (tokens + kBlockTokens - 1) / kBlockTokens;
}

// The fused kernels' problem for a batch whose sequences all have n_q queries.
AttentionProblem fused_problem(const PagedBatch& batch, const QueryRows& q,
                               const AttentionOptions& o, int kv_heads, int n_q) {
  AttentionProblem p;
  p.q = q.q;
  p.seq_lens = batch.seq_len;
  p.out = q.out;
  p.batch = batch.batch;
  p.n_q = n_q;
  p.n_heads = o.n_heads;
  p.kv_heads = kv_heads;
  p.max_len = batch.max_len;
  p.scale = o.scale;
  p.split_tokens = o.split_tokens;
  p.programmatic_launch = programmatic_launch_enabled();  // kernels/cuda/launch.h
  return p;
}

// ----------------------------------------------------------------------------- dense

class DenseDeviceFormat final : public DeviceFormat {
 public:
  DenseDeviceFormat(DenseElem elem, int kv_heads, int head_dim)
      : f_{elem, kv_heads, head_dim}, geometry_(block_geometry(f_)) {}

  std::string type_name() const override {
    return str_cat("dense-", kv_dtype_name(kv_dtype_of(f_.elem)));
  }
  int kv_heads() const override { return f_.kv_heads; }
  int head_dim() const override { return f_.head_dim; }
  size_t block_bytes() const override { return geometry_.block_bytes; }
  size_t bytes_per_token() const override {
    return size_t(2) * f_.kv_heads * f_.head_dim * kv_dtype_bytes(kv_dtype_of(f_.elem));
  }
  bool zeroed_workspace() const override { return false; }

  void append(const PagedBatch& batch, const TQSequenceState*, const AppendRows& rows,
              cudaStream_t stream) const override {
    paged_append(f_, batch, rows, stream);
  }

  // The fused fp16 kernel serves head_dim 128 without window or soft-cap; it needs a zeroed
  // workspace of its own, so the generic kernels serve everything else.
  bool fused(const AttentionOptions& o) const {
    return f_.elem == DenseElem::kF16 && f_.head_dim == 128 && o.sliding_window == 0 &&
           o.logit_softcap == 0;
  }
  size_t workspace_bytes(const PagedBatch& batch, const QueryRows& q,
                         const AttentionOptions& o) const override {
    return paged_attention_workspace_bytes(batch, q, o, f_.kv_heads, f_.head_dim);
  }
  void attend(const PagedBatch& batch, const TQSequenceState*, const QueryRows& q,
              const AttentionOptions& o, int, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) const override {
    paged_attention(f_, batch, q, o, workspace, workspace_bytes, stream);
  }

  std::unique_ptr<KVCache> host_cache() const override {
    return std::make_unique<DenseKVCache>(f_.kv_heads, f_.head_dim, kv_dtype_of(f_.elem));
  }

  std::unique_ptr<KVCache> to_host(const std::vector<uint8_t>& blocks, int64_t tokens,
                                   const std::vector<std::vector<int>>&,
                                   const std::vector<std::vector<int>>&,
                                   const std::vector<uint16_t>&) const override {
    auto cache = host_cache();
    const int heads = f_.kv_heads, d = f_.head_dim;
    const size_t es = kv_dtype_bytes(kv_dtype_of(f_.elem));
    std::vector<float> k(size_t(heads) * d), v(k.size());  // one token [kv_heads, d]
    for (int64_t t = 0; t < tokens; ++t) {
      const uint8_t* block = blocks.data() + size_t(t / kBlockTokens) * geometry_.block_bytes;
      for (int h = 0; h < heads; ++h) {
        const size_t row = (size_t(h) * kBlockTokens + size_t(t % kBlockTokens)) * d * es;
        widen(block + geometry_.k_offset + row, d, &k[size_t(h) * d]);
        widen(block + geometry_.v_offset + row, d, &v[size_t(h) * d]);
      }
      cache->append(k.data(), v.data(), 1);
    }
    return cache;
  }

  std::vector<uint8_t> from_host(const KVCache& host) const override {
    const auto& cache = dynamic_cast<const DenseKVCache&>(host);
    const int64_t tokens = cache.size();
    const int heads = f_.kv_heads, d = f_.head_dim;
    const size_t es = kv_dtype_bytes(kv_dtype_of(f_.elem));
    std::vector<uint8_t> blocks(size_t(blocks_for(tokens)) * geometry_.block_bytes);
    std::vector<float> k, v;
    cache.copy_tokens(0, tokens, &k, &v);  // [tokens, kv_heads, d]
    for (int64_t t = 0; t < tokens; ++t) {
      uint8_t* block = blocks.data() + size_t(t / kBlockTokens) * geometry_.block_bytes;
      for (int h = 0; h < heads; ++h) {
        const size_t row = (size_t(h) * kBlockTokens + size_t(t % kBlockTokens)) * d * es;
        const size_t src = (size_t(t) * heads + h) * d;
        narrow(&k[src], d, block + geometry_.k_offset + row);
        narrow(&v[src], d, block + geometry_.v_offset + row);
      }
    }
    return blocks;
  }

 private:
  void widen(const uint8_t* src, int n, float* dst) const {
    for (int i = 0; i < n; ++i) {
      switch (f_.elem) {
        case DenseElem::kF32:
          std::memcpy(&dst[i], src + 4 * i, 4);
          break;
        case DenseElem::kF16:
          dst[i] = f16_to_f32(load_u16(src + 2 * i));
          break;
        case DenseElem::kBF16:
          dst[i] = bf16_to_f32(load_u16(src + 2 * i));
          break;
      }
    }
  }
  void narrow(const float* src, int n, uint8_t* dst) const {
    for (int i = 0; i < n; ++i) {
      switch (f_.elem) {
        case DenseElem::kF32:
          std::memcpy(dst + 4 * i, &src[i], 4);
          break;
        case DenseElem::kF16:
          store_u16(dst + 2 * i, f32_to_f16(src[i]));
          break;
        case DenseElem::kBF16:
          store_u16(dst + 2 * i, f32_to_bf16(src[i]));
          break;
      }
    }
  }
  static uint16_t load_u16(const uint8_t* p) {
    uint16_t x;
    std::memcpy(&x, p, 2);
    return x;
  }
  static void store_u16(uint8_t* p, uint16_t x) { std::memcpy(p, &x, 2); }

  DenseFormat f_;
  BlockGeometry geometry_;
};

// A DenseDeviceFormat whose global-layer attention takes the fused fp16 kernel.
class FusedDenseDeviceFormat final : public DeviceFormat {
 public:
  FusedDenseDeviceFormat(int kv_heads) : base_(DenseElem::kF16, kv_heads, 128) {}

  std::string type_name() const override { return base_.type_name(); }
  int kv_heads() const override { return base_.kv_heads(); }
  int head_dim() const override { return 128; }
  size_t block_bytes() const override { return base_.block_bytes(); }
  size_t bytes_per_token() const override { return base_.bytes_per_token(); }
  bool zeroed_workspace() const override { return true; }
  void append(const PagedBatch& batch, const TQSequenceState* states, const AppendRows& rows,
              cudaStream_t stream) const override {
    base_.append(batch, states, rows, stream);
  }
  size_t workspace_bytes(const PagedBatch& batch, const QueryRows& q,
                         const AttentionOptions& o) const override {
    return attention_workspace_bytes(fused_problem(batch, q, o, kv_heads(), q.max_n_q),
                                     CacheKind::kDense);
  }
  void attend(const PagedBatch& batch, const TQSequenceState*, const QueryRows& q,
              const AttentionOptions& o, int n_q, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) const override {
    DenseCacheView view;
    view.block_table = batch.block_table;
    view.table_stride = batch.table_stride;
    dense_attention(view, fused_problem(batch, q, o, kv_heads(), n_q), workspace, workspace_bytes,
                    stream);
  }
  std::unique_ptr<KVCache> host_cache() const override { return base_.host_cache(); }
  std::unique_ptr<KVCache> to_host(const std::vector<uint8_t>& blocks, int64_t tokens,
                                   const std::vector<std::vector<int>>& ko,
                                   const std::vector<std::vector<int>>& vo,
                                   const std::vector<uint16_t>& sinks) const override {
    return base_.to_host(blocks, tokens, ko, vo, sinks);
  }
  std::vector<uint8_t> from_host(const KVCache& host) const override {
    return base_.from_host(host);
  }

 private:
  DenseDeviceFormat base_;
};

// ----------------------------------------------------------------------------- fused TurboQuant

// Integer-bit MSE codecs, head_dim 128, key and value bits with a fused kernel
// (kernels/cuda/attention/kernels.h): the fused kernels and the tile format of tq_layout.h.
class TQFusedDeviceFormat final : public DeviceFormat {
 public:
  TQFusedDeviceFormat(int kv_heads, const TurboQuantKVConfig& config)
      : kv_heads_(kv_heads),
        config_(config),
        layout_{int(config.key_bits), int(config.value_bits)},
        codec_(config.seed, config.norm_correction, layout_.key_bits, layout_.value_bits,
               config.unbiased_norm),
        value_norm_max_(1) {
    value_norm_max_.zero();
  }

  std::string type_name() const override { return "turboquant"; }
  int kv_heads() const override { return kv_heads_; }
  int head_dim() const override { return 128; }
  size_t block_bytes() const override {
    return size_t(kv_heads_) * kTilesPerBlock * layout_.tile_bytes();
  }
  size_t bytes_per_token() const override {
    return size_t(kv_heads_) * layout_.tile_bytes() / TQTileLayout::kTileTokens;
  }
  bool zeroed_workspace() const override { return true; }
  // Centering: the means per sequence (TQSequenceState), subtracted by the quantize kernel; the
  // value means are added to the attention output by a second kernel.
  bool calibrates() const override { return config_.center_keys || config_.center_values; }
  size_t nbytes(int64_t tokens, bool calibrated) const override {
    const size_t means = calibrated ? size_t(config_.center_keys + config_.center_values) * 2 *
                                          size_t(kv_heads_) * 128
                                    : 0;
    return size_t(tokens) * bytes_per_token() + means;
  }

  void append(const PagedBatch& batch, const TQSequenceState* states, const AppendRows& rows,
              cudaStream_t stream) const override {
    TQQuantizeProblem p;
    if (calibrates()) p.states = states;
    p.k = rows.k;
    p.v = rows.v;
    p.row_seq = rows.row_seq;
    p.row_pos = rows.row_pos;
    p.rows = rows.rows;
    p.kv_heads = kv_heads_;
    p.block_table = const_cast<uint8_t* const*>(batch.block_table);
    p.table_stride = batch.table_stride;
    // One maximum for every sequence of the format: a larger scale than a sequence needs is
    // still exact (a power of two).
    p.value_norm_max = const_cast<unsigned*>(value_norm_max_.data());
    tq_quantize(codec_.kernel_codec(), p, stream);
  }
  bool append_qkv(const PagedBatch& batch, const AppendRows& rows, const QkvPostProblem& qp,
                  cudaStream_t stream) const override {
    if (calibrates() || qp.q_norm != nullptr || qp.k_norm != nullptr || qp.head_dim != 128 ||
        qp.kv_heads != kv_heads_ || qp.tokens != rows.rows ||
        !tq_rope_quantize_supported(qp.rotary_dim)) {
      return false;
    }
    TQRopeQuantizeProblem p;
    p.qkv = qp.qkv;
    p.bias = qp.bias;
    p.positions = qp.positions;
    p.inv_freq = qp.inv_freq;
    p.rotary_dim = qp.rotary_dim;
    p.attention_scaling = qp.attention_scaling;
    p.heads = qp.heads;
    p.q = qp.q;
    p.cache.row_seq = rows.row_seq;
    p.cache.row_pos = rows.row_pos;
    p.cache.rows = rows.rows;
    p.cache.kv_heads = kv_heads_;
    p.cache.block_table = const_cast<uint8_t* const*>(batch.block_table);
    p.cache.table_stride = batch.table_stride;
    p.cache.value_norm_max = const_cast<unsigned*>(value_norm_max_.data());
    tq_rope_quantize(codec_.kernel_codec(), p, stream);
    return true;
  }
  size_t workspace_bytes(const PagedBatch& batch, const QueryRows& q,
                         const AttentionOptions& o) const override {
    return attention_workspace_bytes(fused_problem(batch, q, o, kv_heads_, q.max_n_q),
                                     CacheKind::kTurboQuant);
  }
  void attend(const PagedBatch& batch, const TQSequenceState* states, const QueryRows& q,
              const AttentionOptions& o, int n_q, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) const override {
    if (o.logit_softcap != 0 || o.sliding_window != 0) {
      throw Unsupported("the fused TurboQuant kernel has no soft-cap or sliding window");
    }
    TQCacheView view;
    view.block_table = batch.block_table;
    view.table_stride = batch.table_stride;
    view.value_norm_max = value_norm_max_.data();
    tq_attention(codec_.kernel_codec(), view, fused_problem(batch, q, o, kv_heads_, n_q), workspace,
                 workspace_bytes, stream);
    if (config_.center_values) {
      add_value_means(states, batch.batch, n_q, o.n_heads, kv_heads_, 128, q.out, stream);
    }
  }

  std::unique_ptr<KVCache> host_cache() const override {
    return std::make_unique<TurboQuantKVCache>(kv_heads_, 128, config_);
  }
  std::unique_ptr<KVCache> to_host(const std::vector<uint8_t>& blocks, int64_t tokens,
                                   const std::vector<std::vector<int>>&,
                                   const std::vector<std::vector<int>>&,
                                   const std::vector<uint16_t>&) const override {
    auto cache = std::make_unique<TurboQuantKVCache>(kv_heads_, 128, config_);
    const int n_blocks = int(blocks_for(tokens));
    const size_t kc = size_t(layout_.key_code_bytes()), vc = size_t(layout_.value_code_bytes());
    cache->key_rows().grow(tokens);
    cache->value_rows().grow(tokens);
    for (int h = 0; h < kv_heads_; ++h) {
      const std::vector<uint8_t> tiles =
          tq_head_tiles_from_blocks(blocks.data(), n_blocks, kv_heads_, h, layout_.tile_bytes());
      const TQHostCodes codes =
          tq_codes_from_tiles(tiles.data(), int(tokens), layout_.key_bits, layout_.value_bits);
      for (int64_t t = 0; t < tokens; ++t) {
        std::memcpy(cache->key_rows().codes(h, t), &codes.key_codes[size_t(t) * kc], kc);
        std::memcpy(cache->value_rows().codes(h, t), &codes.value_codes[size_t(t) * vc], vc);
        *cache->key_rows().aux(h, t) = codes.key_norms[size_t(t)];
        *cache->value_rows().aux(h, t) = codes.value_norms[size_t(t)];
      }
    }
    return cache;
  }
  std::vector<uint8_t> from_host(const KVCache& host) const override {
    const auto& cache = dynamic_cast<const TurboQuantKVCache&>(host);
    const int64_t tokens = cache.size();
    std::vector<uint8_t> blocks(size_t(blocks_for(tokens)) * block_bytes());
    const size_t kc_bytes = size_t(layout_.key_code_bytes());
    const size_t vc_bytes = size_t(layout_.value_code_bytes());
    for (int h = 0; h < kv_heads_; ++h) {
      TQHostCodes codes;
      codes.tokens = int(tokens);
      codes.key_bits = layout_.key_bits;
      codes.value_bits = layout_.value_bits;
      for (int64_t t = 0; t < tokens; ++t) {
        const uint8_t* kc = cache.key_rows().codes(h, t);
        const uint8_t* vc = cache.value_rows().codes(h, t);
        codes.key_codes.insert(codes.key_codes.end(), kc, kc + kc_bytes);
        codes.value_codes.insert(codes.value_codes.end(), vc, vc + vc_bytes);
        codes.key_norms.push_back(*cache.key_rows().aux(h, t));
        codes.value_norms.push_back(*cache.value_rows().aux(h, t));
      }
      const std::vector<uint8_t> tiles = tq_tiles_from_codes(codes);
      tq_blocks_from_head_tiles(tiles.data(), int(tiles.size() / size_t(layout_.tile_bytes())),
                                kv_heads_, h, blocks.data(), layout_.tile_bytes());
    }
    return blocks;
  }

 private:
  int kv_heads_;
  TurboQuantKVConfig config_;
  TQTileLayout layout_;
  TQDeviceCodec codec_;
  DeviceBuffer<unsigned> value_norm_max_;
};

std::string plan_key(const LayerCachePlan& p, DenseElem elem) {
  switch (p.kind) {
    case LayerCacheKind::kDense:
    case LayerCacheKind::kRotating:
      return str_cat("dense ", int(elem), " ", p.kv_heads, " ", p.head_dim, " ",
                     p.kind == LayerCacheKind::kRotating ? "rotating" : "global");
    case LayerCacheKind::kTurboQuant:
      return str_cat("turboquant ", p.kv_heads, " ", p.head_dim, " ", p.turboquant.key_bits, " ",
                     p.turboquant.value_bits, " ", p.turboquant.seed, " ",
                     int(norm_mode_byte(p.turboquant)), " ", p.turboquant.center_keys, " ",
                     p.turboquant.center_values, " ", p.turboquant.sink_tokens, " ",
                     p.turboquant.recent_tokens);
    case LayerCacheKind::kUniform:
      return str_cat("uniform ", p.kv_heads, " ", p.head_dim, " ", p.uniform.key_bits, " ",
                     p.uniform.value_bits, " ", p.uniform.group_size, " ", p.uniform.hadamard, " ",
                     p.uniform.hadamard ? p.uniform.seed : 0);
  }
  return "?";
}

// Integer key and value bits with a fused kernel, head_dim 128, no sink or recent tokens (those
// take the generic kernels, which attend them apart).
bool has_fused_turboquant(const LayerCachePlan& p) {
  if (p.kind != LayerCacheKind::kTurboQuant || p.head_dim != 128) return false;
  if (p.turboquant.sink_tokens > 0 || p.turboquant.recent_tokens > 0) return false;
  const double kb = p.turboquant.key_bits, vb = p.turboquant.value_bits;
  return kb == double(int(kb)) && vb == double(int(vb)) && tq_attention_supported(int(kb), int(vb));
}

}  // namespace

std::string format_key(const LayerCachePlan& p, DenseElem elem, bool fused) {
  return str_cat(fused ? "fused " : "generic ", plan_key(p, elem));
}

std::shared_ptr<const DeviceFormat> make_device_format(const LayerCachePlan& p, DenseElem elem,
                                                       bool fused) {
  switch (p.kind) {
    case LayerCacheKind::kDense:
      if (fused && elem == DenseElem::kF16 && p.head_dim == 128) {
        return std::make_shared<FusedDenseDeviceFormat>(p.kv_heads);
      }
      return std::make_shared<DenseDeviceFormat>(elem, p.kv_heads, p.head_dim);
    case LayerCacheKind::kRotating:
      return std::make_shared<DenseDeviceFormat>(elem, p.kv_heads, p.head_dim);
    case LayerCacheKind::kTurboQuant:
      if (fused && has_fused_turboquant(p)) {
        return std::make_shared<TQFusedDeviceFormat>(p.kv_heads, p.turboquant);
      }
      return make_generic_turboquant_format(p);
    case LayerCacheKind::kUniform:
      return make_generic_uniform_format(p);
  }
  throw Unsupported("unknown cache kind");
}

}  // namespace turbokv::cuda
