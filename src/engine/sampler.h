// Next-token sampling from one row of logits: repetition penalty, temperature, top-k, top-p,
// min-p, then a draw from the seeded xoshiro256** of src/quant (bit-identical everywhere).
// Temperature 0 is greedy argmax. Masked ids (ids the model scores but the tokenizer does not
// have) and NaN logits are never chosen.
#pragma once

#include <cstdint>
#include <span>
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
  // repetition_context of which the penalty sees.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

 private:
  SamplingOptions options_;
  std::span<const int32_t> masked_;
  Xoshiro256 rng_;  // splitmix64-seeded xoshiro256**, as the codecs use
  std::vector<std::pair<float, int32_t>> candidates_;  // [vocab] (prob or logit, id)
};

// The id of the largest logit, lowest id on ties; NaN counts as -inf.
int32_t argmax(std::span<const float> logits);

}  // namespace turbokv
