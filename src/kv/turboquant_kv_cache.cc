#include "kv/turboquant_kv_cache.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "kv/byte_io.h"
#include "quant/codec_split.h"

namespace turbokv {
namespace {

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

uint8_t norm_mode_byte(const TurboQuantKVConfig& config) {
  return config.unbiased_norm ? 2 : (config.norm_correction ? 1 : 0);
}

quant::TurboQuantConfig turboquant_codec_config(int head_dim, double bits, quant::TensorRole role,
                                                const TurboQuantKVConfig& config) {
  quant::TurboQuantConfig c;
  c.dim = head_dim;
  c.bits = bits;
  c.seed = config.seed;
  c.role = role;
  c.norm_correction = config.norm_correction;
  c.unbiased_norm = config.unbiased_norm;
  return c;
}

TurboQuantKVCache::Tensor::Tensor(int kv_heads, int head_dim, double tensor_bits,
                                  quant::TensorRole tensor_role, const TurboQuantKVConfig& config)
    : bits(tensor_bits), role(tensor_role), rows([&] {
        check_kv_shape(kv_heads, head_dim);
        const auto probe =
            make_codec(turboquant_codec_config(head_dim, tensor_bits, tensor_role, config));
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
      values_(kv_heads, head_dim, config.value_bits, quant::TensorRole::kValue, config),
      sinks_(KVDType::kF16, kv_heads, head_dim),
      recent_(KVDType::kF16, kv_heads, head_dim) {
  if (config.sink_tokens < 0 || config.sink_tokens > kMaxSinkTokens) {
    throw InvalidArgument(str_cat("TurboQuant sink_tokens=", config.sink_tokens,
                                  " is out of range (0..", kMaxSinkTokens, ")"),
                          "kv_sink_tokens");
  }
  if (config.recent_tokens < 0 || config.recent_tokens > kMaxRecentTokens) {
    throw InvalidArgument(str_cat("TurboQuant recent_tokens=", config.recent_tokens,
                                  " is out of range (0..", kMaxRecentTokens, ")"),
                          "kv_recent_tokens");
  }
  keys_.centered = config.center_keys;
  values_.centered = config.center_values;
  for (Tensor* tensor : {&keys_, &values_}) {
    if (!tensor->split()) make_codecs(*tensor, nullptr, 0, nullptr);
    tensor->ready = !tensor->needs_calibration();
  }
}

void TurboQuantKVCache::set_means(Tensor& tensor, std::vector<uint16_t> mean) {
  tensor.mean_f32.resize(mean.size());
  for (size_t i = 0; i < mean.size(); ++i) tensor.mean_f32[i] = f16_to_f32(mean[i]);
  tensor.mean = std::move(mean);
}

void TurboQuantKVCache::calibrate(Tensor& tensor, const float* x, int n_tokens) {
  const size_t row = size_t(kv_heads_) * head_dim_;
  if (tensor.centered) {
    std::vector<double> sum(row, 0.0);  // [kv_heads, head_dim]
    for (int t = 0; t < n_tokens; ++t) {
      for (size_t i = 0; i < row; ++i) sum[i] += double(x[t * row + i]);
    }
    std::vector<uint16_t> mean(row);
    for (size_t i = 0; i < row; ++i) {
      mean[i] = f32_to_f16(std::clamp(float(sum[i] / double(n_tokens)), -65504.0f, 65504.0f));
    }
    set_means(tensor, std::move(mean));
  }
  std::vector<float> centered;  // [n_tokens, kv_heads, head_dim]: x - mu, what the codec sees
  if (tensor.centered) {
    centered.resize(size_t(n_tokens) * row);
    for (int t = 0; t < n_tokens; ++t) {
      for (size_t i = 0; i < row; ++i) centered[t * row + i] = x[t * row + i] - tensor.mean_f32[i];
    }
    x = centered.data();
  }
  if (tensor.split()) make_codecs(tensor, x, n_tokens, nullptr);
  tensor.ready = true;
}

void TurboQuantKVCache::make_codecs(Tensor& tensor, const float* first_chunk, int n_tokens,
                                    const std::vector<std::vector<int>>* orders) {
  tensor.codecs.clear();
  tensor.per_head.clear();
  if (!tensor.split()) {
    tensor.codecs.push_back(
        make_codec(turboquant_codec_config(head_dim_, tensor.bits, tensor.role, config_)));
  } else {
    std::vector<float> head_rows(static_cast<size_t>(n_tokens) * head_dim_);  // [n, d]
    for (int h = 0; h < kv_heads_; ++h) {
      quant::TurboQuantConfig c =
          turboquant_codec_config(head_dim_, tensor.bits, tensor.role, config_);
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
    tensor->ready = !tensor->centered || !tensor->mean.empty();
  }
}

void TurboQuantKVCache::encode(Tensor& tensor, const float* x, int n_tokens, int64_t first_row) {
  const int64_t items = static_cast<int64_t>(n_tokens) * kv_heads_;
  const quant::Isa isa = quant::best_isa();
  parallel_for(items, 32, [&](int64_t begin, int64_t end) {
    std::vector<float> centered(tensor.centered ? head_dim_ : 0);  // [head_dim]
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / kv_heads_;
      const int h = static_cast<int>(i % kv_heads_);
      const float* vec = x + i * head_dim_;
      if (tensor.centered) {
        const float* mu = &tensor.mean_f32[size_t(h) * head_dim_];
        for (int j = 0; j < head_dim_; ++j) centered[j] = vec[j] - mu[j];
        vec = centered.data();
      }
      tensor.per_head[h]->quantize(vec, tensor.rows.codes(h, first_row + t),
                                   tensor.rows.aux(h, first_row + t), isa);
    }
  });
}

void TurboQuantKVCache::append(const float* k, const float* v, int n_tokens) {
  check_append(k, v, n_tokens);
  if (n_tokens == 0) return;
  const int64_t row = int64_t(kv_heads_) * head_dim_;
  const int64_t to_sinks = std::clamp<int64_t>(config_.sink_tokens - size(), 0, n_tokens);
  if (to_sinks > 0) sinks_.append(k, v, to_sinks);
  const int coded = n_tokens - static_cast<int>(to_sinks);
  if (coded == 0) return;
  k += to_sinks * row;
  v += to_sinks * row;
  if (config_.recent_tokens > 0) {
    // The W - 1 positions before the chunk stay: its first queries read them.
    recent_.drop_oldest(recent_.rows() - held_recent_rows());
    recent_.append(k, v, coded);
  }
  if (!keys_.ready || !values_.ready) calibrated_on_ = sinks_.rows() + coded;
  if (!keys_.ready) calibrate(keys_, k, coded);
  if (!values_.ready) calibrate(values_, v, coded);
  const int64_t first = keys_.rows.grow(coded);
  values_.rows.grow(coded);
  encode(keys_, k, coded, first);
  encode(values_, v, coded, first);
}

void TurboQuantKVCache::calibrate_from(const float* k, const float* v, int n_tokens,
                                       int64_t first_pos) {
  check_append(k, v, n_tokens);
  if (size() > 0) throw InvalidArgument("calibrate_from: the cache already holds tokens");
  if (first_pos < 0) throw InvalidArgument(str_cat("calibrate_from: first_pos ", first_pos));
  if (n_tokens == 0 || (keys_.ready && values_.ready)) return;
  // As append() on a cache holding first_pos tokens.
  const int64_t row = int64_t(kv_heads_) * head_dim_;
  const int64_t to_sinks = std::clamp<int64_t>(config_.sink_tokens - first_pos, 0, n_tokens);
  const int coded = n_tokens - static_cast<int>(to_sinks);
  if (coded == 0) return;
  k += to_sinks * row;
  v += to_sinks * row;
  calibrated_on_ = std::min<int64_t>(first_pos, config_.sink_tokens) + to_sinks + coded;
  if (!keys_.ready) calibrate(keys_, k, coded);
  if (!values_.ready) calibrate(values_, v, coded);
}

void TurboQuantKVCache::trim(int64_t n) {
  if (n < 0 || n > size()) {
    throw InvalidArgument(str_cat("trim(", n, ") on a cache of ", size(), " tokens"));
  }
  const int64_t from_codes = std::min(n, coded_rows());
  if (config_.recent_tokens > 1 && from_codes > 0) {
    throw Unsupported(str_cat(
        "trim(", n, "): a cache with kv_recent_tokens=", config_.recent_tokens,
        " no longer holds the fp16 rows of the positions before its last ", recent_.rows()));
  }
  recent_.drop_newest(std::min(from_codes, recent_.rows()));
  keys_.rows.drop_newest(from_codes);
  values_.rows.drop_newest(from_codes);
  sinks_.drop_newest(n - from_codes);
}

size_t TurboQuantKVCache::bytes_per_token_head() const {
  return keys_.rows.code_bytes() + 2 * size_t(keys_.rows.aux_per_vector()) +
         values_.rows.code_bytes() + 2 * size_t(values_.rows.aux_per_vector());
}

size_t TurboQuantKVCache::nbytes() const {
  size_t metadata = 0;  // means and split channel orders: 2 bytes per channel per KV head each
  for (const Tensor* tensor : {&keys_, &values_}) {
    if (!tensor->ready) continue;
    if (tensor->split()) metadata += 2 * size_t(kv_heads_) * head_dim_;
    if (tensor->centered) metadata += 2 * size_t(kv_heads_) * head_dim_;
  }
  return keys_.rows.nbytes() + values_.rows.nbytes() + metadata + sinks_.nbytes() +
         recent_.nbytes();
}

TurboQuantKVView TurboQuantKVCache::view() const {
  TurboQuantKVView view;
  view.keys = CodedTensorView{keys_.rows.codes(0, 0), keys_.rows.aux(0, 0), keys_.per_head.data()};
  view.values =
      CodedTensorView{values_.rows.codes(0, 0), values_.rows.aux(0, 0), values_.per_head.data()};
  view.kv_heads = kv_heads_;
  view.head_dim = head_dim_;
  view.head_stride = keys_.rows.capacity();
  view.n_tokens = coded_rows();
  view.first_pos = sinks_.rows();
  return view;
}

void TurboQuantKVCache::attend_coded(const AttentionQueries& queries, const AttentionParams& params,
                                     float* out, float* lse) const {
  attention_turboquant(view(), queries, params, out, best_attention_isa(), lse);
  const int group = params.n_heads / kv_heads_;
  for (int i = 0; i < queries.n_q; ++i) {
    for (int head = 0; head < params.n_heads; ++head) {
      const int64_t r = int64_t(i) * params.n_heads + head;
      const size_t mean_offset = size_t(head / group) * head_dim_;
      if (lse != nullptr && keys_.centered) {
        const float* qr = queries.q + r * head_dim_;
        const float* mu = &keys_.mean_f32[mean_offset];
        float dot = 0;
        for (int j = 0; j < head_dim_; ++j) dot += qr[j] * mu[j];
        lse[r] += params.scale * dot;
      }
      if (values_.centered) {
        float* o = out + r * head_dim_;
        const float* mu = &values_.mean_f32[mean_offset];
        for (int j = 0; j < head_dim_; ++j) o[j] = o[j] + mu[j];
      }
    }
  }
}

void TurboQuantKVCache::attend(const float* q, int n_q, const AttentionParams& params,
                               float* out) const {
  check_attend(q, n_q, params, out);
  if (keys_.centered && params.logit_softcap > 0) {
    throw Unsupported(
        "TurboQuant key centering needs shift-invariant scores; soft-capped attention "
        "(logit_softcap > 0) must keep keys uncentered");
  }
  const AttentionQueries queries{q, n_q, size() - n_q};
  if (config_.recent_tokens > 0) {
    attend_with_recent(queries, params, out);
    return;
  }
  if (sinks_.rows() == 0) {
    attend_coded(queries, params, out, nullptr);
    return;
  }
  if (coded_rows() == 0) {
    attention_dense(sinks_.view(0), queries, params, out);
    return;
  }
  // Two partial softmaxes over disjoint keys (sinks, coded rows), merged by log-sum-exp.
  const int64_t rows = int64_t(n_q) * params.n_heads;
  std::vector<float> lse_coded(static_cast<size_t>(rows)),
      lse_sinks(lse_coded.size());                        // [n_q, heads]
  std::vector<float> sink_out(size_t(rows) * head_dim_);  // [n_q, n_heads, d]
  attend_coded(queries, params, out, lse_coded.data());
  attention_dense(sinks_.view(0), queries, params, sink_out.data(), best_attention_isa(),
                  lse_sinks.data());
  merge_attention_partials(out, lse_coded.data(), sink_out.data(), lse_sinks.data(), rows,
                           head_dim_, out, nullptr);
}

int64_t TurboQuantKVCache::held_recent_rows() const {
  return std::min<int64_t>(config_.recent_tokens - 1, coded_rows());
}

void TurboQuantKVCache::attend_with_recent(const AttentionQueries& queries,
                                           const AttentionParams& params, float* out) const {
  const int W = config_.recent_tokens;
  const int64_t n_q = queries.n_q;
  // The queries read positions > first query - W from the recent rows.
  const int64_t needed = std::min<int64_t>(coded_rows(), n_q + W - 1);
  if (recent_.rows() < needed) {
    throw Unsupported(str_cat("attend: a cache with kv_recent_tokens=", W, " holds ",
                              recent_.rows(), " recent rows, ", n_q, " queries need ", needed,
                              " (each chunk's queries attend once, after its append)"));
  }
  const int64_t rows = n_q * params.n_heads;
  std::vector<float> lse(static_cast<size_t>(rows)), part_lse(lse.size());  // [n_q, heads]
  std::vector<float> part(size_t(rows) * head_dim_);                        // [n_q, heads, d]
  // Recent rows: positions (p - W, p], and within the model's sliding window.
  AttentionParams recent_params = params;
  recent_params.sliding_window = params.sliding_window > 0 ? std::min(params.sliding_window, W) : W;
  attention_dense(recent_view(), queries, recent_params, out, best_attention_isa(), lse.data());
  // Coded rows: positions <= p - W. Queries moved back by W see exactly those; the model's
  // window (p - Ws, p] becomes (p' - (Ws - W), p'].
  if (coded_rows() > 0 && (params.sliding_window <= 0 || params.sliding_window > W)) {
    AttentionQueries shifted = queries;
    shifted.first_pos -= W;
    AttentionParams coded_params = params;
    if (params.sliding_window > 0) coded_params.sliding_window = params.sliding_window - W;
    attend_coded(shifted, coded_params, part.data(), part_lse.data());
    merge_attention_partials(out, lse.data(), part.data(), part_lse.data(), rows, head_dim_, out,
                             lse.data());
  }
  if (sinks_.rows() > 0) {
    attention_dense(sinks_.view(0), queries, params, part.data(), best_attention_isa(),
                    part_lse.data());
    merge_attention_partials(out, lse.data(), part.data(), part_lse.data(), rows, head_dim_, out,
                             nullptr);
  }
  // No later query reads a position before size() - (W - 1).
  recent_.drop_oldest(recent_.rows() - held_recent_rows());
}

void TurboQuantKVCache::set_recent_rows(const std::vector<uint16_t>& rows, int64_t n) {
  if (config_.recent_tokens == 0 || n != held_recent_rows() ||
      rows.size() != 2 * size_t(n) * kv_heads_ * head_dim_) {
    throw InvalidArgument(str_cat("set_recent_rows: ", n, " rows (", rows.size(),
                                  " halves) for a cache that holds ", held_recent_rows(),
                                  " recent rows of ", kv_heads_, " x ", head_dim_));
  }
  ByteWriter bytes;
  for (uint16_t h : rows) bytes.put<uint16_t>(h);
  ByteReader in(bytes.buffer().data(), bytes.buffer().size());
  recent_.drop_oldest(recent_.rows());
  recent_.read_append(in, n);
}

void TurboQuantKVCache::write_state(ByteWriter& out) const {
  write_cache_header(out, "turboquant", kv_heads_, head_dim_);
  out.put<double>(config_.key_bits);
  out.put<double>(config_.value_bits);
  out.put<uint64_t>(config_.seed);
  out.put<uint8_t>(norm_mode_byte(config_));
  out.put<uint8_t>(config_.center_keys ? 1 : 0);
  out.put<uint8_t>(config_.center_values ? 1 : 0);
  out.put<int32_t>(config_.sink_tokens);
  // Only when set: records of caches without it (cache file version 3) stay as they were.
  if (config_.recent_tokens > 0) out.put<int32_t>(config_.recent_tokens);
  for (const Tensor* tensor : {&keys_, &values_}) {
    out.put<uint8_t>(tensor->ready && tensor->needs_calibration() ? 1 : 0);
    for (uint16_t m : tensor->mean) out.put<uint16_t>(m);
    for (const auto& order : tensor->channel_orders()) {  // [kv_heads][d] or none
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
  expect_same("norm mode (0 plain, 1 norm correction, 2 unbiased)",
              int(in.get<uint8_t>("norm mode")), int(norm_mode_byte(config_)));
  expect_same("key centering", int(in.get<uint8_t>("key centering")), int(config_.center_keys));
  expect_same("value centering", int(in.get<uint8_t>("value centering")),
              int(config_.center_values));
  expect_same("sink tokens", in.get<int32_t>("sink tokens"), config_.sink_tokens);
  if (config_.recent_tokens > 0) {
    expect_same("recent tokens", in.get<int32_t>("recent tokens"), config_.recent_tokens);
  }
  keys_.rows.drop_newest(keys_.rows.rows());
  values_.rows.drop_newest(values_.rows.rows());
  sinks_.drop_newest(sinks_.rows());
  recent_.drop_newest(recent_.rows());
  const size_t row = size_t(kv_heads_) * head_dim_;
  for (Tensor* tensor : {&keys_, &values_}) {
    const bool calibrated = in.get<uint8_t>("calibration flag") != 0;
    if (calibrated && !tensor->needs_calibration()) {
      throw FormatError("cache file: calibration state for a tensor that has none");
    }
    tensor->mean.clear();
    tensor->mean_f32.clear();
    tensor->ready = !tensor->needs_calibration();
    if (!calibrated) {
      if (tensor->split()) {  // not calibrated yet in the record either
        tensor->codecs.clear();
        tensor->per_head.clear();
      }
      continue;
    }
    if (tensor->centered) {
      std::vector<uint16_t> mean(row);
      for (uint16_t& m : mean) m = in.get<uint16_t>("mean");
      set_means(*tensor, std::move(mean));
    }
    if (tensor->split()) {
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
    tensor->ready = true;
  }
  calibrated_on_ = in.get<int64_t>("calibration tokens");
  if (calibrated_on_ < 0 || calibrated_on_ > kMaxFileTokens) {
    throw FormatError(
        str_cat("cache file: calibration token count ", calibrated_on_, " is out of range"));
  }
}

// Rows [first, first + n): the fp16 sink rows among them, then the coded ones.
void TurboQuantKVCache::write_rows(ByteWriter& out, int64_t first, int64_t n) const {
  check_rows(first, n);
  const int64_t sink_end = std::min(first + n, sinks_.rows());
  const int64_t sinks = std::max<int64_t>(sink_end - first, 0);
  sinks_.write(out, first, sinks);
  const int64_t coded_first = std::max<int64_t>(first - sinks_.rows(), 0);
  keys_.rows.write(out, coded_first, n - sinks);
  values_.rows.write(out, coded_first, n - sinks);
  if (config_.recent_tokens <= 1) return;
  // The window's fp16 rows exist for the last positions only.
  if (first + n != size()) {
    throw Unsupported(str_cat("rows [", first, ", ", first + n, ") of a cache of ", size(),
                              " tokens with kv_recent_tokens=", config_.recent_tokens,
                              ": a prefix lacks the fp16 rows of its last positions"));
  }
  const int64_t held = held_recent_rows();
  recent_.write(out, recent_.rows() - held, held);
}

void TurboQuantKVCache::read_rows(ByteReader& in, int64_t n) {
  if (n < 0) throw FormatError(str_cat("cache file: ", n, " rows"));
  const int64_t sinks = std::clamp<int64_t>(config_.sink_tokens - size(), 0, n);
  sinks_.read_append(in, sinks);
  if (n > sinks && (!keys_.ready || !values_.ready)) {
    throw FormatError(
        "cache file: coded tokens without the means or split channel orders they were coded "
        "with");
  }
  keys_.rows.read_append(in, n - sinks);
  values_.rows.read_append(in, n - sinks);
  if (config_.recent_tokens <= 1) return;
  recent_.drop_oldest(recent_.rows());
  recent_.read_append(in, held_recent_rows());
}

DenseKVCache TurboQuantKVCache::to_dense() const {
  DenseKVCache dense(kv_heads_, head_dim_, KVDType::kF32);
  const int64_t sinks = sinks_.rows(), n = coded_rows();
  const size_t row = size_t(kv_heads_) * head_dim_;
  std::vector<float> k((sinks + n) * row), v((sinks + n) * row);  // [sinks + n, kv_heads, d]
  sinks_.read_f32(0, sinks, k.data(), v.data());
  parallel_for(n * kv_heads_, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / kv_heads_;
      const int h = static_cast<int>(i % kv_heads_);
      for (auto [tensor, x] : {std::pair{&keys_, &k}, std::pair{&values_, &v}}) {
        float* out = x->data() + sinks * row + i * head_dim_;
        tensor->per_head[h]->dequantize(tensor->rows.codes(h, t), tensor->rows.aux(h, t), out);
        if (!tensor->centered) continue;
        const float* mu = &tensor->mean_f32[size_t(h) * head_dim_];
        for (int j = 0; j < head_dim_; ++j) out[j] = out[j] + mu[j];
      }
    }
  });
  dense.append(k.data(), v.data(), static_cast<int>(sinks + n));
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
