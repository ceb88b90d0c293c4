// Sampler and RNG implementation (see sampler.h for the order of the filters).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "core/error.h"

namespace turbokv {

void validate_sampling(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    throw InvalidArgument(str_cat("temperature=", o.temperature, " must be a number >= 0"),
                          "temperature");
  }
  if (o.top_k < 0)
    throw InvalidArgument(str_cat("top_k=", o.top_k, " must be >= 0 (0: off)"), "top_k");
  if (!std::isfinite(o.top_p) || o.top_p <= 0 || o.top_p > 1) {
    throw InvalidArgument(str_cat("top_p=", o.top_p, " must be in (0, 1]"), "top_p");
  }
  if (!std::isfinite(o.min_p) || o.min_p < 0 || o.min_p > 1) {
    throw InvalidArgument(str_cat("min_p=", o.min_p, " must be in [0, 1]"), "min_p");
  }
  if (!std::isfinite(o.repetition_penalty) || o.repetition_penalty <= 0) {
    throw InvalidArgument(
        str_cat("repetition_penalty=", o.repetition_penalty, " must be > 0 (1: off)"),
        "repetition_penalty");
  }
  if (o.repetition_context < 0) {
    throw InvalidArgument(str_cat("repetition_context=", o.repetition_context, " must be >= 0"),
                          "repetition_context");
  }
  for (const auto& [name, v] :
       {std::pair<const char*, double>{"presence_penalty", o.presence_penalty},
        {"frequency_penalty", o.frequency_penalty}}) {
    if (!std::isfinite(v) || v < -2 || v > 2) {
      throw InvalidArgument(str_cat(name, "=", v, " must be in [-2, 2] (0: off)"), name);
    }
  }
  for (const auto& [id, bias] : o.logit_bias) {
    if (id < 0) {
      throw InvalidArgument(str_cat("logit_bias: token id ", id, " is negative"), "logit_bias");
    }
    if (!std::isfinite(bias) || bias < -100 || bias > 100) {
      throw InvalidArgument(
          str_cat("logit_bias: the bias ", bias, " of token ", id, " must be in [-100, 100]"),
          "logit_bias");
    }
  }
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best] || std::isnan(logits[best])) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(const SamplingOptions& options, std::span<const int32_t> masked_ids)
    : options_(options), masked_(masked_ids), rng_(options.seed) {
  validate_sampling(options);
}

void Sampler::count_generated(std::span<const int32_t> history, size_t n_generated) {
  n_generated = std::min(n_generated, history.size());
  if (n_generated < counted_) {  // a new sequence of calls (tests reuse samplers)
    counts_.clear();
    counted_ = 0;
  }
  const auto generated = history.subspan(history.size() - n_generated);
  for (size_t i = counted_; i < generated.size(); ++i) ++counts_[generated[i]];
  counted_ = generated.size();
}

int32_t Sampler::sample_with_logprobs(std::span<float> logits, std::span<const int32_t> history,
                                      size_t n_generated, int top_n, float* logprob,
                                      std::vector<TokenLogprob>* top) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // The masked, NaN-free logits before any rule: sample() applies the same masking first.
  raw_.assign(logits.begin(), logits.end());
  for (float& l : raw_) {
    if (std::isnan(l)) l = kNegInf;
  }
  for (int32_t id : masked_) {
    if (id >= 0 && static_cast<size_t>(id) < raw_.size()) raw_[id] = kNegInf;
  }
  const float max_logit = *std::max_element(raw_.begin(), raw_.end());
  double sum = 0;
  for (float l : raw_) {
    if (l != kNegInf) sum += std::exp(double(l) - max_logit);
  }
  const double log_norm = double(max_logit) + std::log(sum);
  auto log_p = [&](int32_t id) {
    return raw_[id] == kNegInf ? kNegInf : static_cast<float>(double(raw_[id]) - log_norm);
  };
  const int32_t token = sample(logits, history, n_generated);
  *logprob = log_p(token);
  top->clear();
  if (top_n > 0) {
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < static_cast<int32_t>(raw_.size()); ++id) {
      if (raw_[id] != kNegInf) ids.push_back(id);
    }
    const size_t n = std::min<size_t>(static_cast<size_t>(top_n), ids.size());
    std::partial_sort(
        ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(),
        [&](int32_t a, int32_t b) { return raw_[a] > raw_[b] || (raw_[a] == raw_[b] && a < b); });
    for (size_t i = 0; i < n; ++i) top->push_back({ids[i], log_p(ids[i])});
  }
  return token;
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history,
                        size_t n_generated) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // NaN would break the ordering below and +inf the softmax; a masked id can never win, not
  // even on ties.
  for (float& l : logits) {
    if (std::isnan(l)) l = kNegInf;
    if (l == -kNegInf) l = std::numeric_limits<float>::max();
  }
  for (int32_t id : masked_) {
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[id] = kNegInf;
  }
  // Every allowed logit -inf (a broken model): the lowest allowed id, whatever the options.
  const auto first_allowed = [&] {
    for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id) {
      if (!std::binary_search(masked_.begin(), masked_.end(), id)) return id;
    }
    return int32_t{0};
  };
  if (logits[argmax(logits)] == kNegInf) return first_allowed();
  if (options_.repetition_penalty != 1.0 && options_.repetition_context > 0) {
    const size_t n = std::min<size_t>(history.size(), options_.repetition_context);
    std::unordered_set<int32_t> seen(history.end() - n, history.end());
    const float penalty = static_cast<float>(options_.repetition_penalty);
    for (int32_t id : seen) {
      if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
      float& l = logits[id];
      l = l > 0 ? l / penalty : l * penalty;
    }
  }
  if (options_.presence_penalty != 0 || options_.frequency_penalty != 0) {
    count_generated(history, n_generated);
    for (const auto& [id, count] : counts_) {
      if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
      logits[id] -=
          static_cast<float>(options_.presence_penalty + options_.frequency_penalty * count);
    }
  }
  for (const auto& [id, bias] : options_.logit_bias) {
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) {
      logits[id] += static_cast<float>(bias);  // -inf (masked) stays -inf
    }
  }
  if (options_.temperature == 0) {
    const int32_t best = argmax(logits);
    return logits[best] == kNegInf ? first_allowed() : best;
  }

  // Candidates (the ids with a finite logit: never a masked one) sorted by logit, highest first
  // (ties: lower id first), then cut by top-k.
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] != kNegInf) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
  }
  const auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (candidates_.empty()) return first_allowed();
  size_t n = candidates_.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < n) {
    n = options_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(), by_logit);
    candidates_.resize(n);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }

  // Softmax at the temperature, in double for a stable sum.
  const double inv_t = 1.0 / options_.temperature;
  const double max_logit = candidates_[0].first;
  std::vector<double> probs(n);  // [n] descending
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    probs[i] = std::exp((candidates_[i].first - max_logit) * inv_t);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;

  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  size_t keep = n;
  if (options_.top_p < 1.0) {
    double mass = 0;
    for (size_t i = 0; i < n; ++i) {
      mass += probs[i];
      if (mass >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  // min-p: drop tokens below min_p times the most likely one.
  if (options_.min_p > 0) {
    const double floor = options_.min_p * probs[0];
    size_t i = 1;
    while (i < keep && probs[i] >= floor) ++i;
    keep = i;
  }

  double kept_mass = 0;
  for (size_t i = 0; i < keep; ++i) kept_mass += probs[i];
  const double r = rng_.uniform() * kept_mass;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace turbokv
