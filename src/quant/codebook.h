// Lloyd-Max codebooks for one coordinate of a uniformly random unit vector in R^d (docs/design.md,
// "TurboQuant"): density f(t) ∝ (1 - t²)^((d-3)/2) on [-1, 1]. One codebook per (d, b), computed
// once, cached process-wide (thread-safe) and never freed.
#pragma once

#include <vector>

namespace turbokv::quant {

struct Codebook {
  int dim = 0;
  int bits = 0;
  // [2^bits] ascending, symmetric (c[k] == -c[2^bits-1-k]), in absolute units (≈ N(0, 1/d)).
  std::vector<float> centroids;
  // [2^bits - 1] decision boundaries: boundaries[k] = float((double(c[k]) + double(c[k+1])) / 2).
  // The code of y is #{k : boundaries[k] < y}; NaN maps to 0.
  std::vector<float> boundaries;
  // E‖u - û‖² of a unit vector quantized with this codebook, from the exact integrals.
  double unit_mse = 0;
  int iterations = 0;  // Lloyd + Newton steps used
};

// Throws InvalidArgument for dim < 2 or bits outside 1..8.
const Codebook& lloyd_max_codebook(int dim, int bits);

// Nearest centroid by the boundary rule above (the scalar reference of every quantize path).
inline int nearest_centroid(const Codebook& book, float y) {
  int lo = 0;
  int hi = int(book.boundaries.size());
  while (lo < hi) {  // count of boundaries strictly below y
    const int mid = (lo + hi) / 2;
    if (book.boundaries[mid] < y) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace turbokv::quant
