#include "kv/uniform_kv_cache.h"

#include "core/error.h"
#include "core/threads.h"
#include "kv/byte_io.h"

namespace turbokv {
namespace {

quant::UniformCodec make_codec(int kv_heads, int head_dim, int bits, int group_size,
                               const char* role) {
  check_kv_shape(kv_heads, head_dim);
  try {
    return quant::UniformCodec(quant::UniformCodecConfig{head_dim, bits, group_size});
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(str_cat("uniform KV cache, ", role, ": ", e.what()));
  }
}

}  // namespace

UniformKVCache::UniformKVCache(int kv_heads, int head_dim, const UniformKVConfig& config)
    : kv_heads_(kv_heads),
      head_dim_(head_dim),
      config_(config),
      key_codec_(make_codec(kv_heads, head_dim, config.key_bits, config.group_size, "keys")),
      value_codec_(make_codec(kv_heads, head_dim, config.value_bits, config.group_size, "values")),
      keys_(kv_heads, key_codec_.code_bytes(), key_codec_.params_per_vector()),
      values_(kv_heads, value_codec_.code_bytes(), value_codec_.params_per_vector()) {
  if (config.hadamard) {
    key_rotation_ = quant::Rotation::get(config.seed, head_dim, quant::RotationRole::kKey);
    value_rotation_ = quant::Rotation::get(config.seed, head_dim, quant::RotationRole::kValue);
  }
}

void UniformKVCache::encode(const quant::UniformCodec& codec, const quant::Rotation* rotation,
                            PackedRows& rows, const float* x, int n_tokens, int64_t first_row) {
  const quant::Isa isa = quant::best_isa();
  parallel_for(static_cast<int64_t>(n_tokens) * kv_heads_, 32, [&](int64_t begin, int64_t end) {
    std::vector<float> rotated(rotation != nullptr ? head_dim_ : 0);  // [head_dim]
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / kv_heads_;
      const int h = static_cast<int>(i % kv_heads_);
      const float* vec = x + i * head_dim_;
      if (rotation != nullptr) {
        rotation->apply(vec, rotated.data(), isa);
        vec = rotated.data();
      }
      codec.quantize(vec, rows.codes(h, first_row + t), rows.aux(h, first_row + t), isa);
    }
  });
}

void UniformKVCache::append(const float* k, const float* v, int n_tokens) {
  check_append(k, v, n_tokens);
  if (n_tokens == 0) return;
  const int64_t first = keys_.grow(n_tokens);
  values_.grow(n_tokens);
  encode(key_codec_, key_rotation_.get(), keys_, k, n_tokens, first);
  encode(value_codec_, value_rotation_.get(), values_, v, n_tokens, first);
}

void UniformKVCache::trim(int64_t n) {
  if (n < 0 || n > size()) {
    throw InvalidArgument(str_cat("trim(", n, ") on a cache of ", size(), " tokens"));
  }
  keys_.drop_newest(n);
  values_.drop_newest(n);
}

UniformKVView UniformKVCache::view() const {
  UniformKVView view;
  view.keys = UniformTensorView{keys_.codes(0, 0), keys_.aux(0, 0), &key_codec_};
  view.values = UniformTensorView{values_.codes(0, 0), values_.aux(0, 0), &value_codec_};
  view.kv_heads = kv_heads_;
  view.head_dim = head_dim_;
  view.head_stride = keys_.capacity();
  view.n_tokens = size();
  return view;
}

void UniformKVCache::attend(const float* q, int n_q, const AttentionParams& params,
                            float* out) const {
  check_attend(q, n_q, params, out);
  if (!config_.hadamard) {
    attention_uniform(view(), AttentionQueries{q, n_q, size() - n_q}, params, out);
    return;
  }
  const int64_t rows = int64_t(n_q) * params.n_heads;
  std::vector<float> rq(size_t(rows) * head_dim_), rotated_out(rq.size());  // [n_q, heads, d]
  for (int64_t r = 0; r < rows; ++r) {
    key_rotation_->apply(q + r * head_dim_, &rq[size_t(r) * head_dim_]);
  }
  attention_uniform(view(), AttentionQueries{rq.data(), n_q, size() - n_q}, params,
                    rotated_out.data());
  for (int64_t r = 0; r < rows; ++r) {
    value_rotation_->apply_transpose(&rotated_out[size_t(r) * head_dim_], out + r * head_dim_);
  }
}

void UniformKVCache::write_state(ByteWriter& out) const {
  write_cache_header(out, "uniform", kv_heads_, head_dim_);
  out.put<int32_t>(config_.key_bits);
  out.put<int32_t>(config_.value_bits);
  out.put<int32_t>(config_.group_size);
  out.put<uint8_t>(config_.hadamard ? 1 : 0);
  out.put<uint64_t>(config_.seed);
}

void UniformKVCache::read_state(ByteReader& in) {
  read_cache_header(in, "uniform", kv_heads_, head_dim_);
  expect_same("key bits", in.get<int32_t>("key bits"), config_.key_bits);
  expect_same("value bits", in.get<int32_t>("value bits"), config_.value_bits);
  expect_same("group size", in.get<int32_t>("group size"), config_.group_size);
  expect_same("hadamard", int(in.get<uint8_t>("hadamard")), int(config_.hadamard));
  expect_same("rotation seed", in.get<uint64_t>("seed"), config_.seed);
  keys_.drop_newest(keys_.rows());
  values_.drop_newest(values_.rows());
}

void UniformKVCache::write_rows(ByteWriter& out, int64_t first, int64_t n) const {
  check_rows(first, n);
  keys_.write(out, first, n);
  values_.write(out, first, n);
}

void UniformKVCache::read_rows(ByteReader& in, int64_t n) {
  keys_.read_append(in, n);
  values_.read_append(in, n);
}

DenseKVCache UniformKVCache::to_dense() const {
  DenseKVCache dense(kv_heads_, head_dim_, KVDType::kF32);
  const int64_t n = size();
  std::vector<float> k(static_cast<size_t>(n) * kv_heads_ * head_dim_);  // [n, kv_heads, d]
  std::vector<float> v(k.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < kv_heads_; ++h) {
      const int64_t i = t * kv_heads_ + h;
      key_codec_.dequantize(keys_.codes(h, t), keys_.aux(h, t), &k[i * head_dim_]);
      value_codec_.dequantize(values_.codes(h, t), values_.aux(h, t), &v[i * head_dim_]);
      if (config_.hadamard) {
        std::vector<float> rotated(&k[i * head_dim_], &k[(i + 1) * head_dim_]);
        key_rotation_->apply_transpose(rotated.data(), &k[i * head_dim_]);
        rotated.assign(&v[i * head_dim_], &v[(i + 1) * head_dim_]);
        value_rotation_->apply_transpose(rotated.data(), &v[i * head_dim_]);
      }
    }
  }
  dense.append(k.data(), v.data(), static_cast<int>(n));
  return dense;
}

std::unique_ptr<UniformKVCache> UniformKVCache::convert_from(const DenseKVCache& dense,
                                                             const UniformKVConfig& config) {
  auto cache = std::make_unique<UniformKVCache>(dense.kv_heads(), dense.head_dim(), config);
  std::vector<float> k, v;
  dense.copy_tokens(0, dense.size(), &k, &v);
  cache->append(k.data(), v.data(), static_cast<int>(dense.size()));
  return cache;
}

}  // namespace turbokv
