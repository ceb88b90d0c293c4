// Lloyd-Max codebooks against the check values of docs/design.md, "TurboQuant" (computed
// independently of our code), symmetry, monotonicity, and parameter validation.
#include "quant/codebook.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"

namespace turbokv::quant {
namespace {

TEST(Codebook, MatchesDesignCheckValuesAtDim128) {
  // Positive half, in units of 1/sqrt(d) (docs/design.md, from a numpy prototype that stopped at
  // ~1e-4 of the fixed point: its 4-digit values differ from the converged ones by up to 1e-4;
  // OptimalityConditionsHoldByBruteForceIntegration checks convergence independently).
  const std::vector<std::vector<double>> expected = {
      {0.7994},
      {0.4525, 1.5052},
      {0.2444, 0.7533, 1.3366, 2.1315},
      {0.1279, 0.3864, 0.6536, 0.9370, 1.2477, 1.6043, 2.0459, 2.6888}};
  for (int bits = 1; bits <= 4; ++bits) {
    const Codebook& book = lloyd_max_codebook(128, bits);
    const int levels = 1 << bits;
    ASSERT_EQ(int(book.centroids.size()), levels);
    for (int j = 0; j < levels / 2; ++j) {
      const double scaled = book.centroids[levels / 2 + j] * std::sqrt(128.0);
      EXPECT_NEAR(scaled, expected[bits - 1][j], 1.5e-4) << "bits " << bits << " level " << j;
    }
  }
}

TEST(Codebook, UnitMseMatchesDesignAtDim128) {
  const double expected[] = {0.3609, 0.1160, 0.0340, 0.0093};
  for (int bits = 1; bits <= 4; ++bits) {
    EXPECT_NEAR(lloyd_max_codebook(128, bits).unit_mse, expected[bits - 1],
                expected[bits - 1] * 0.01)
        << "bits " << bits;
  }
}

// Centroid condition c_j = E[t | t in cell j] by a plain midpoint rule on a fine t grid (no
// use of the closed forms in codebook.cc).
TEST(Codebook, OptimalityConditionsHoldByBruteForceIntegration) {
  for (int bits : {2, 4}) {
    const int dim = 128;
    const Codebook& book = lloyd_max_codebook(dim, bits);
    const int levels = 1 << bits;
    std::vector<double> mass(levels, 0.0), first(levels, 0.0);
    const int steps = 2000000;
    for (int s = 0; s < steps; ++s) {
      const double t = -1.0 + (s + 0.5) * 2.0 / steps;
      const double f = std::pow(1.0 - t * t, (dim - 3) / 2.0);
      const int cell = nearest_centroid(book, float(t));
      mass[cell] += f;
      first[cell] += f * t;
    }
    for (int j = 0; j < levels; ++j) {
      EXPECT_NEAR(first[j] / mass[j], book.centroids[j], 2e-6) << "bits " << bits << " cell " << j;
    }
  }
}

TEST(Codebook, SymmetricAndStrictlyIncreasingForAllDimsAndBits) {
  for (int dim : {2, 3, 4, 64, 80, 96, 128, 256}) {
    for (int bits = 1; bits <= 8; ++bits) {
      const Codebook& book = lloyd_max_codebook(dim, bits);
      const int levels = 1 << bits;
      ASSERT_EQ(int(book.boundaries.size()), levels - 1);
      for (int j = 0; j < levels; ++j) {
        EXPECT_EQ(book.centroids[j], -book.centroids[levels - 1 - j]) << dim << "/" << bits;
        EXPECT_LE(std::abs(book.centroids[j]), 1.0f);
      }
      for (int j = 0; j + 1 < levels; ++j) {
        EXPECT_LT(book.centroids[j], book.boundaries[j]) << dim << "/" << bits << " at " << j;
        EXPECT_LT(book.boundaries[j], book.centroids[j + 1]) << dim << "/" << bits << " at " << j;
      }
    }
  }
}

TEST(Codebook, Dim3IsUniformDensity) {
  // d = 3: each coordinate of a random unit vector is uniform on [-1, 1] (Archimedes), whose
  // Lloyd-Max quantizer is the uniform one: centroids -1 + (2j + 1) / L.
  for (int bits = 1; bits <= 4; ++bits) {
    const Codebook& book = lloyd_max_codebook(3, bits);
    const int levels = 1 << bits;
    for (int j = 0; j < levels; ++j) {
      EXPECT_NEAR(book.centroids[j], -1.0 + (2.0 * j + 1) / levels, 1e-6);
    }
  }
}

TEST(Codebook, NearestCentroidIsTheClosestCentroid) {
  const Codebook& book = lloyd_max_codebook(128, 3);
  for (float y = -0.5f; y <= 0.5f; y += 0.00037f) {
    const int idx = nearest_centroid(book, y);
    for (int j = 0; j < 8; ++j) {
      EXPECT_LE(std::abs(y - book.centroids[idx]), std::abs(y - book.centroids[j]) + 1e-7f);
    }
  }
}

TEST(Codebook, InvalidParametersThrowWithMessage) {
  try {
    lloyd_max_codebook(128, 0);
    FAIL() << "bits 0 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bits 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(lloyd_max_codebook(128, 9), InvalidArgument);
  EXPECT_THROW(lloyd_max_codebook(1, 3), InvalidArgument);
  EXPECT_THROW(lloyd_max_codebook(0, 3), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::quant
