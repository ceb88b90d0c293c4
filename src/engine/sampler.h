// Next-token sampling from one row of logits: repetition penalty, presence/frequency penalties,
// logit bias, temperature, top-k, top-p, min-p, then a draw from the seeded xoshiro256** of
// src/core (bit-identical everywhere).
// Temperature 0 is greedy argmax. Masked ids (ids the model scores but the tokenizer does not
// have) and NaN logits are never chosen.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/rng.h"
#include "turbokv/engine.h"

namespace turbokv {

// Throws InvalidArgument naming the field when an option is out of range.
void validate_sampling(const SamplingOptions& options);

class Sampler {
 public:
  // masked_ids: sorted ids that must never be sampled; the span must outlive the sampler.
  explicit Sampler(const SamplingOptions& options, std::span<const int32_t> masked_ids = {});
  // logits: [vocab], modified in place. history: tokens so far (prompt + generated), the last
  // repetition_context of which the repetition penalty sees; its last n_generated are the
  // generated ones, which the presence and frequency penalties count.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history, size_t n_generated = 0);
  // As sample(), and *logprob / *top (top_n entries, most likely first) from the log-softmax
  // of the logits as given (after masking, before every other rule).
  int32_t sample_with_logprobs(std::span<float> logits, std::span<const int32_t> history,
                               size_t n_generated, int top_n, float* logprob,
                               std::vector<TokenLogprob>* top);

 private:
  void count_generated(std::span<const int32_t> history, size_t n_generated);

  SamplingOptions options_;
  std::span<const int32_t> masked_;
  std::unordered_map<int32_t, int> counts_;  // generated token -> occurrences
  size_t counted_ = 0;                       // generated tokens in counts_
  std::vector<float> raw_;                   // [vocab] logits before the rules (logprobs)
  Xoshiro256 rng_;  // splitmix64-seeded xoshiro256**, as the codecs use
  std::vector<std::pair<float, int32_t>> candidates_;  // [vocab] (prob or logit, id)
};

// The id of the largest logit, lowest id on ties; NaN counts as -inf.
int32_t argmax(std::span<const float> logits);

}  // namespace turbokv
