#include "kv/turboquant_kv_cache.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/threads.h"
#include "kv/byte_io.h"
#include "quant/codec_split.h"

namespace turbokv {
namespace {

quant::TurboQuantConfig codec_config(int head_dim, double bits, quant::TensorRole role,
                                     const TurboQuantKVConfig& config) {
  quant::TurboQuantConfig c;
  c.dim = head_dim;
  c.bits = bits;
  c.seed = config.seed;
  c.role = role;
  c.norm_correction = config.norm_correction;
  return c;
}

const char* role_name(quant::TensorRole role) {
  return role == quant::TensorRole::kKey ? "key" : "value";
}

std::unique_ptr<quant::TurboQuantCodec> make_codec(const quant::TurboQuantConfig& config) {
  try {
    return quant::make_turboquant_codec(config);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(str_cat("TurboQuant ", role_name(config.role), " codec: ", e.what()));
  }
}

}  // namespace

TurboQuantKVCache::Tensor::Tensor(int kv_heads, int head_dim, double tensor_bits,
                                  quant::TensorRole tensor_role, const TurboQuantKVConfig& config)
    : bits(tensor_bits), role(tensor_role), rows([&] {
        check_kv_shape(kv_heads, head_dim);
        const auto probe = make_codec(codec_config(head_dim, tensor_bits, tensor_role, config));
        return PackedRows(kv_heads, probe->code_bytes(), probe->norms_per_vector());
      }()) {}

bool TurboQuantKVCache::Tensor::split() const {
  return std::floor(bits) != bits;
}

std::vector<std::vector<int>> TurboQuantKVCache::Tensor::channel_orders() const {
  std::vector<std::vector<int>> orders;
  if (!split()) return orders;
  for (const auto& codec : codecs) {
    orders.push_back(static_cast<const quant::SplitCodec&>(*codec).channel_order());
  }
  return orders;
}

TurboQuantKVCache::TurboQuantKVCache(int kv_heads, int head_dim, const TurboQuantKVConfig& config)
    : kv_heads_(kv_heads),
      head_dim_(head_dim),
      config_(config),
      keys_(kv_heads, head_dim, config.key_bits, quant::TensorRole::kKey, config),
      values_(kv_heads, head_dim, config.value_bits, quant::TensorRole::kValue, config) {
  if (!keys_.split()) make_codecs(keys_, nullptr, 0, nullptr);
  if (!values_.split()) make_codecs(values_, nullptr, 0, nullptr);
}

void TurboQuantKVCache::make_codecs(Tensor& tensor, const float* first_chunk, int n_tokens,
                                    const std::vector<std::vector<int>>* orders) {
  tensor.codecs.clear();
  tensor.per_head.clear();
  if (!tensor.split()) {
    tensor.codecs.push_back(make_codec(codec_config(head_dim_, tensor.bits, tensor.role, config_)));
  } else {
    std::vector<float> head_rows(static_cast<size_t>(n_tokens) * head_dim_);  // [n, d]
    for (int h = 0; h < kv_heads_; ++h) {
      quant::TurboQuantConfig c = codec_config(head_dim_, tensor.bits, tensor.role, config_);
      if (orders != nullptr) {
        c.channel_order = (*orders)[h];
      } else {
        for (int t = 0; t < n_tokens; ++t) {
          std::copy_n(first_chunk + (static_cast<int64_t>(t) * kv_heads_ + h) * head_dim_,
                      head_dim_, &head_rows[static_cast<size_t>(t) * head_dim_]);
        }
        c.channel_order = quant::choose_split_channels(head_rows.data(), n_tokens, head_dim_);
      }
      tensor.codecs.push_back(make_codec(c));
    }
  }
  for (int h = 0; h < kv_heads_; ++h) {
    tensor.per_head.push_back(tensor.codecs[tensor.split() ? h : 0].get());
  }
}

void TurboQuantKVCache::set_channel_orders(const std::vector<std::vector<int>>& key_orders,
                                           const std::vector<std::vector<int>>& value_orders) {
  if (size() > 0) throw InvalidArgument("set_channel_orders: the cache already holds tokens");
  for (auto [tensor, orders] :
       {std::pair{&keys_, &key_orders}, std::pair{&values_, &value_orders}}) {
    if (!tensor->split()) continue;
    if (static_cast<int>(orders->size()) != kv_heads_) {
      throw InvalidArgument(str_cat("split channel orders for ", orders->size(),
                                    " KV heads, the cache has ", kv_heads_));
    }
    make_codecs(*tensor, nullptr, 0, orders);
  }
}

void TurboQuantKVCache::encode(Tensor& tensor, const float* x, int n_tokens, int64_t first_row) {
  const int64_t items = static_cast<int64_t>(n_tokens) * kv_heads_;
  const quant::Isa isa = quant::best_isa();
  parallel_for(items, 32, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / kv_heads_;
      const int h = static_cast<int>(i % kv_heads_);
      tensor.per_head[h]->quantize(x + i * head_dim_, tensor.rows.codes(h, first_row + t),
                                   tensor.rows.aux(h, first_row + t), isa);
    }
  });
}

void TurboQuantKVCache::append(const float* k, const float* v, int n_tokens) {
  check_append(k, v, n_tokens);
  if (n_tokens == 0) return;
  if (keys_.codecs.empty() || values_.codecs.empty()) calibrated_on_ = n_tokens;
  if (keys_.codecs.empty()) make_codecs(keys_, k, n_tokens, nullptr);
  if (values_.codecs.empty()) make_codecs(values_, v, n_tokens, nullptr);
  const int64_t first = keys_.rows.grow(n_tokens);
  values_.rows.grow(n_tokens);
  encode(keys_, k, n_tokens, first);
  encode(values_, v, n_tokens, first);
}

void TurboQuantKVCache::trim(int64_t n) {
  if (n < 0 || n > size()) {
    throw InvalidArgument(str_cat("trim(", n, ") on a cache of ", size(), " tokens"));
  }
  keys_.rows.drop_newest(n);
  values_.rows.drop_newest(n);
}

size_t TurboQuantKVCache::bytes_per_token_head() const {
  return keys_.rows.code_bytes() + 2 * size_t(keys_.rows.aux_per_vector()) +
         values_.rows.code_bytes() + 2 * size_t(values_.rows.aux_per_vector());
}

size_t TurboQuantKVCache::nbytes() const {
  size_t split_metadata = 0;
  for (const Tensor* tensor : {&keys_, &values_}) {
    if (tensor->split() && !tensor->codecs.empty())
      split_metadata += 2 * size_t(kv_heads_) * head_dim_;
  }
  return keys_.rows.nbytes() + values_.rows.nbytes() + split_metadata;
}

TurboQuantKVView TurboQuantKVCache::view() const {
  TurboQuantKVView view;
  view.keys = CodedTensorView{keys_.rows.codes(0, 0), keys_.rows.aux(0, 0), keys_.per_head.data()};
  view.values =
      CodedTensorView{values_.rows.codes(0, 0), values_.rows.aux(0, 0), values_.per_head.data()};
  view.kv_heads = kv_heads_;
  view.head_dim = head_dim_;
  view.head_stride = keys_.rows.capacity();
  view.n_tokens = size();
  view.first_pos = 0;
  return view;
}

void TurboQuantKVCache::attend(const float* q, int n_q, const AttentionParams& params,
                               float* out) const {
  check_attend(q, n_q, params, out);
  attention_turboquant(view(), AttentionQueries{q, n_q, size() - n_q}, params, out);
}

void TurboQuantKVCache::write_state(ByteWriter& out) const {
  write_cache_header(out, "turboquant", kv_heads_, head_dim_);
  out.put<double>(config_.key_bits);
  out.put<double>(config_.value_bits);
  out.put<uint64_t>(config_.seed);
  out.put<uint8_t>(config_.norm_correction ? 1 : 0);
  for (const Tensor* tensor : {&keys_, &values_}) {
    const auto orders = tensor->channel_orders();  // [kv_heads][d] or empty
    out.put<uint8_t>(orders.empty() ? 0 : 1);
    for (const auto& order : orders) {
      for (int channel : order) out.put<uint16_t>(static_cast<uint16_t>(channel));
    }
  }
  out.put<int64_t>(calibrated_on_);
}

void TurboQuantKVCache::read_state(ByteReader& in) {
  read_cache_header(in, "turboquant", kv_heads_, head_dim_);
  expect_same("key bits", in.get<double>("key bits"), config_.key_bits);
  expect_same("value bits", in.get<double>("value bits"), config_.value_bits);
  expect_same("rotation seed", in.get<uint64_t>("seed"), config_.seed);
  expect_same("norm correction", int(in.get<uint8_t>("norm correction")),
              int(config_.norm_correction));
  keys_.rows.drop_newest(keys_.rows.rows());
  values_.rows.drop_newest(values_.rows.rows());
  for (Tensor* tensor : {&keys_, &values_}) {
    const bool has_orders = in.get<uint8_t>("split flag") != 0;
    if (!has_orders) {
      if (tensor->split()) {  // not calibrated yet in the record either
        tensor->codecs.clear();
        tensor->per_head.clear();
      }
      continue;
    }
    if (!tensor->split()) throw FormatError("cache file: channel orders for an unsplit codec");
    std::vector<std::vector<int>> orders(kv_heads_, std::vector<int>(head_dim_));
    for (auto& order : orders) {
      for (int& channel : order) channel = in.get<uint16_t>("split channel order");
    }
    try {
      make_codecs(*tensor, nullptr, 0, &orders);
    } catch (const InvalidArgument& e) {
      throw FormatError(str_cat("cache file: bad split channel order: ", e.what()));
    }
  }
  calibrated_on_ = in.get<int64_t>("calibration tokens");
  if (calibrated_on_ < 0 || calibrated_on_ > kMaxFileTokens) {
    throw FormatError(
        str_cat("cache file: calibration token count ", calibrated_on_, " is out of range"));
  }
}

void TurboQuantKVCache::write_rows(ByteWriter& out, int64_t first, int64_t n) const {
  check_rows(first, n);
  keys_.rows.write(out, first, n);
  values_.rows.write(out, first, n);
}

void TurboQuantKVCache::read_rows(ByteReader& in, int64_t n) {
  if (n > 0 && (keys_.codecs.empty() || values_.codecs.empty())) {
    throw FormatError("cache file: tokens without the split channel orders they were coded with");
  }
  keys_.rows.read_append(in, n);
  values_.rows.read_append(in, n);
}

DenseKVCache TurboQuantKVCache::to_dense() const {
  DenseKVCache dense(kv_heads_, head_dim_, KVDType::kF32);
  const int64_t n = size();
  std::vector<float> k(static_cast<size_t>(n) * kv_heads_ * head_dim_);  // [n, kv_heads, d]
  std::vector<float> v(k.size());
  parallel_for(n * kv_heads_, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / kv_heads_;
      const int h = static_cast<int>(i % kv_heads_);
      keys_.per_head[h]->dequantize(keys_.rows.codes(h, t), keys_.rows.aux(h, t),
                                    &k[i * head_dim_]);
      values_.per_head[h]->dequantize(values_.rows.codes(h, t), values_.rows.aux(h, t),
                                      &v[i * head_dim_]);
    }
  });
  dense.append(k.data(), v.data(), static_cast<int>(n));
  return dense;
}

std::unique_ptr<TurboQuantKVCache> TurboQuantKVCache::convert_from(
    const DenseKVCache& dense, const TurboQuantKVConfig& config) {
  auto cache = std::make_unique<TurboQuantKVCache>(dense.kv_heads(), dense.head_dim(), config);
  std::vector<float> k, v;
  dense.copy_tokens(0, dense.size(), &k, &v);
  cache->append(k.data(), v.data(), static_cast<int>(dense.size()));
  return cache;
}

}  // namespace turbokv
