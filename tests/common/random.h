// Seeded random test inputs shared by the CPU test suites (same generator everywhere, so a
// seed names the same data in every test).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace turbokv::testing {

// n samples of N(0, stddev^2) from mt19937(seed).
inline std::vector<float> random_normal(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (auto& value : x) value = normal(gen);
  return x;
}

}  // namespace turbokv::testing
