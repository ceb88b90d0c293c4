// Helpers for the codec tests: seeded random data (our RNG, so failures reproduce).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace turbokv::quant::testing {

// [n, dim] standard normal values.
inline std::vector<float> gaussian_matrix(int64_t n, int dim, uint64_t seed) {
  Xoshiro256 rng(seed);
  std::vector<float> x(size_t(n) * dim);
  for (auto& v : x) v = float(rng.gaussian());
  return x;
}

// [n, dim] uniformly random unit vectors.
inline std::vector<float> unit_vectors(int64_t n, int dim, uint64_t seed) {
  std::vector<float> x = gaussian_matrix(n, dim, seed);
  for (int64_t t = 0; t < n; ++t) {
    double norm = 0;
    for (int i = 0; i < dim; ++i) norm += double(x[t * dim + i]) * x[t * dim + i];
    norm = std::sqrt(norm);
    for (int i = 0; i < dim; ++i) x[t * dim + i] = float(x[t * dim + i] / norm);
  }
  return x;
}

}  // namespace turbokv::quant::testing
