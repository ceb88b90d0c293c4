// Next-token sampling from one row of logits: repetition penalty, temperature, top-k, top-p,
// min-p, then a draw from the seeded xoshiro256** of src/quant (bit-identical everywhere).
// Temperature 0 is greedy argmax.
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
  explicit Sampler(const SamplingOptions& options);
  // logits: [vocab], modified in place. history: tokens so far (prompt + generated), the last
  // repetition_context of which the penalty sees.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

 private:
  SamplingOptions options_;
  Xoshiro256 rng_;  // splitmix64-seeded xoshiro256**, as the codecs use
  std::vector<std::pair<float, int32_t>> candidates_;  // [vocab] (prob or logit, id)
};

int32_t argmax(std::span<const float> logits);

}  // namespace turbokv
