// Split codec: permute channels, code the two halves with their own MSE codecs.
#include "quant/codec_split.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace turbokv::quant {
namespace {

std::vector<int> checked_order(const SplitCodecConfig& config) {
  if (config.dim < 4) {
    throw InvalidArgument(str_cat("split codec dimension ", config.dim,
                                  " is invalid: need d >= 4 (two halves of >= 2)"));
  }
  if (config.low_bits < 1 || config.low_bits > 7) {
    throw InvalidArgument(str_cat("split codec bits ", config.low_bits + 0.5,
                                  " is invalid: allowed 1.5..7.5 in steps of 1"));
  }
  std::vector<int> order(config.dim);
  std::iota(order.begin(), order.end(), 0);
  if (config.channel_order.empty()) return order;
  if (int(config.channel_order.size()) != config.dim) {
    throw InvalidArgument(str_cat("split channel order has ", config.channel_order.size(),
                                  " entries, expected ", config.dim));
  }
  std::vector<bool> seen(config.dim, false);
  for (int c : config.channel_order) {
    if (c < 0 || c >= config.dim || seen[c]) {
      throw InvalidArgument(str_cat("split channel order is not a permutation of 0..",
                                    config.dim - 1, ": bad or repeated channel ", c));
    }
    seen[c] = true;
  }
  return config.channel_order;
}

MseCodecConfig half_config(const SplitCodecConfig& config, bool high) {
  const bool key = config.role == TensorRole::kKey;
  const int high_dim = (config.dim + 1) / 2;  // round(0.5 d), halves rounded up
  MseCodecConfig c;
  c.dim = high ? high_dim : config.dim - high_dim;
  c.bits = high ? config.low_bits + 1 : config.low_bits;
  c.seed = config.seed;
  c.role = high ? (key ? RotationRole::kKeySplitHigh : RotationRole::kValueSplitHigh)
                : (key ? RotationRole::kKeySplitLow : RotationRole::kValueSplitLow);
  c.norm_correction = config.norm_correction;
  c.unbiased_norm = config.unbiased_norm;
  return c;
}

}  // namespace

SplitCodec::SplitCodec(const SplitCodecConfig& config)
    : dim_(config.dim),
      order_(checked_order(config)),
      high_(half_config(config, true)),
      low_(half_config(config, false)) {}

void SplitCodec::quantize(const float* x, uint8_t* codes, uint16_t* norms, Isa isa) const {
  thread_local std::vector<float> permuted;
  permuted.resize(dim_);
  for (int i = 0; i < dim_; ++i) permuted[i] = x[order_[i]];
  high_.quantize(permuted.data(), codes, norms, isa);
  low_.quantize(permuted.data() + high_.dim(), codes + high_.code_bytes(), norms + 1, isa);
}

void SplitCodec::dequantize(const uint8_t* codes, const uint16_t* norms, float* x) const {
  thread_local std::vector<float> permuted;
  permuted.resize(dim_);
  high_.dequantize(codes, norms, permuted.data());
  low_.dequantize(codes + high_.code_bytes(), norms + 1, permuted.data() + high_.dim());
  for (int i = 0; i < dim_; ++i) x[order_[i]] = permuted[i];
}

void SplitCodec::rotate_query(const float* q, float* rq, Isa isa) const {
  thread_local std::vector<float> permuted;
  permuted.resize(dim_);
  for (int i = 0; i < dim_; ++i) permuted[i] = q[order_[i]];
  high_.rotate_query(permuted.data(), rq, isa);
  low_.rotate_query(permuted.data() + high_.dim(), rq + high_.dim(), isa);
}

void SplitCodec::score_multi(const float* rq, int n_queries, const uint8_t* codes,
                             const uint16_t* norms, int64_t n, float* scores, Isa isa) const {
  const size_t stride = code_bytes();
  high_.score_rows(QueryRows{rq, n_queries, size_t(dim_)}, CodeRows{codes, stride, norms, 2}, n,
                   scores, false, isa);
  low_.score_rows(QueryRows{rq + high_.dim(), n_queries, size_t(dim_)},
                  CodeRows{codes + high_.code_bytes(), stride, norms + 1, 2}, n, scores, true, isa);
}

void SplitCodec::accumulate_multi(const float* weights, int n_queries, const uint8_t* codes,
                                  const uint16_t* norms, int64_t n, float* acc, Isa isa) const {
  const size_t stride = code_bytes();
  const QueryRows w{weights, n_queries, size_t(n)};
  high_.accumulate_rows(w, CodeRows{codes, stride, norms, 2}, n, acc, size_t(dim_), isa);
  low_.accumulate_rows(w, CodeRows{codes + high_.code_bytes(), stride, norms + 1, 2}, n,
                       acc + high_.dim(), size_t(dim_), isa);
}

void SplitCodec::unrotate(const float* acc, float* out, Isa isa) const {
  thread_local std::vector<float> permuted;
  permuted.resize(dim_);
  high_.unrotate(acc, permuted.data(), isa);
  low_.unrotate(acc + high_.dim(), permuted.data() + high_.dim(), isa);
  for (int i = 0; i < dim_; ++i) out[order_[i]] = permuted[i];
}

std::vector<int> choose_split_channels(const float* x, int64_t n, int dim) {
  if (n < 1 || dim < 1) {
    throw InvalidArgument(
        str_cat("choose_split_channels needs n >= 1 and dim >= 1, got n=", n, " dim=", dim));
  }
  std::vector<double> mean_abs(dim, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    for (int i = 0; i < dim; ++i) mean_abs[i] += std::abs(double(x[t * dim + i]));
  }
  std::vector<int> order(dim);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return mean_abs[a] > mean_abs[b]; });
  return order;
}

}  // namespace turbokv::quant
