// Next-token sampling from one row of logits: repetition penalty, temperature, top-k, top-p,
// min-p, then a draw from our own seeded generator (bit-identical on every platform).
// Temperature 0 is greedy argmax.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "turbokv/engine.h"

namespace turbokv {

// Throws InvalidArgument naming the field when an option is out of range.
void validate_sampling(const SamplingOptions& options);

// splitmix64-seeded xoshiro256**.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1) with 53 random bits

 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // logits: [vocab], modified in place. history: tokens so far (prompt + generated), the last
  // repetition_context of which the penalty sees.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

 private:
  SamplingOptions options_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // [vocab] (prob or logit, id)
};

int32_t argmax(std::span<const float> logits);

}  // namespace turbokv
