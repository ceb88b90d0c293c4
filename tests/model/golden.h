// The golden check against Hugging Face transformers, for any backend: the reference prompt's
// logits within a stated tolerance, and the greedy continuation token for token (prompt
// prefill, then one token per decode step through the caches).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/model.h"

namespace turbokv::testing {

inline int32_t argmax(const float* v, int n) {
  return int32_t(std::max_element(v, v + n) - v);
}

// Returns the largest absolute logit difference to the reference (also printed).
inline float check_golden(const Model& model, const std::function<LayerCaches()>& make_caches,
                          const std::string& reference, float logits_tolerance,
                          const std::string& what) {
  const SafetensorsFile ref = SafetensorsFile::open(reference);
  const std::vector<int64_t> ids64 = SafetensorsFile::to_i64(ref.at("input_ids"));
  const std::vector<float> want = SafetensorsFile::to_f32(ref.at("logits"));
  const std::vector<int64_t> generated = SafetensorsFile::to_i64(ref.at("generated"));
  const std::vector<int32_t> ids(ids64.begin(), ids64.end());
  const int V = model.info().vocab_size;
  const int n = int(ids.size());
  EXPECT_EQ(want.size(), size_t(n) * V);
  if (want.size() != size_t(n) * V) return INFINITY;

  LayerCaches caches = make_caches();
  std::vector<float> logits(size_t(n) * V);  // [n, V]
  Model::Chunk chunk{ids.data(), n, &caches, logits.data(), true};
  model.forward({&chunk, 1});
  float max_diff = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(logits[i] - want[i]));
  }
  std::printf("  %s: largest logit difference to the reference %.3g\n", what.c_str(), max_diff);
  EXPECT_LE(max_diff, logits_tolerance) << what;

  // `generated` holds only the new tokens (its length is the number generated).
  std::vector<int32_t> greedy;
  std::vector<float> last(static_cast<size_t>(V));
  int32_t next = argmax(logits.data() + size_t(n - 1) * V, V);
  for (size_t i = 0; i < generated.size(); ++i) {
    greedy.push_back(next);
    if (i + 1 == generated.size()) break;
    Model::Chunk step{&next, 1, &caches, last.data(), false};
    model.forward({&step, 1});
    next = argmax(last.data(), V);
  }
  EXPECT_EQ(std::vector<int64_t>(greedy.begin(), greedy.end()), generated) << what;
  return max_diff;
}

}  // namespace turbokv::testing
