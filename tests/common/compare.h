// Comparisons of float outputs shared by the CPU test suites.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace turbokv::testing {

// Max |a - b| relative to the largest |b|; every a must be finite.
inline float relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  float max_diff = 0, max_ref = 1e-30f;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(std::isfinite(a[i])) << i;
    max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  return max_diff / max_ref;
}

}  // namespace turbokv::testing
