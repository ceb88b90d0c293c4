// Rotations: orthogonality (R^T R = I) for Hadamard and dense sizes, the Hadamard definition
// checked against an explicit Sylvester matrix, determinism in (seed, d, role), and
// scalar == AVX2 bit for bit.
#include "quant/rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "test_util.h"

namespace turbokv::quant {
namespace {

// Column j of R: R e_j.
std::vector<double> rotation_matrix(const Rotation& r) {
  const int d = r.dim();
  std::vector<double> m(size_t(d) * d);
  std::vector<float> e(d), col(d);
  for (int j = 0; j < d; ++j) {
    std::fill(e.begin(), e.end(), 0.0f);
    e[j] = 1.0f;
    r.apply(e.data(), col.data(), Isa::kScalar);
    for (int i = 0; i < d; ++i) m[size_t(i) * d + j] = col[i];
  }
  return m;
}

TEST(Rotation, IsOrthogonal) {
  for (int d : {64, 80, 96, 128, 256}) {
    const auto r = Rotation::get(0, d, RotationRole::kKey);
    EXPECT_EQ(r->is_hadamard(), d == 64 || d == 128 || d == 256);
    const std::vector<double> m = rotation_matrix(*r);
    double worst = 0;
    for (int a = 0; a < d; ++a) {
      for (int b = 0; b < d; ++b) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += m[size_t(i) * d + a] * m[size_t(i) * d + b];
        worst = std::max(worst, std::abs(dot - (a == b ? 1.0 : 0.0)));
      }
    }
    EXPECT_LT(worst, 1e-5) << "d " << d;
  }
}

TEST(Rotation, HadamardMatchesSylvesterMatrixWithSigns) {
  const int d = 16;
  const auto r = Rotation::get(3, d, RotationRole::kValue);
  const std::vector<double> m = rotation_matrix(*r);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      const double h = (__builtin_popcount(i & j) % 2) ? -1.0 : 1.0;  // Sylvester H_d[i][j]
      const double s = r->sign_flips()[j] ? -1.0 : 1.0;
      EXPECT_NEAR(m[size_t(i) * d + j], h * s / 4.0, 1e-7);
    }
  }
}

TEST(Rotation, TransposeInvertsApply) {
  for (int d : {2, 3, 8, 80, 128}) {
    const auto r = Rotation::get(1, d, RotationRole::kKey);
    const std::vector<float> x = testing::gaussian_matrix(1, d, 8);
    std::vector<float> y(d), back(d);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2}) {
      r->apply(x.data(), y.data(), isa);
      r->apply_transpose(y.data(), back.data(), isa);
      for (int i = 0; i < d; ++i) EXPECT_NEAR(back[i], x[i], 1e-5) << "d " << d;
    }
  }
}

TEST(Rotation, DeterministicInSeedDimAndRole) {
  const auto a = Rotation::get(5, 96, RotationRole::kKey);
  const Rotation fresh(5, 96, RotationRole::kKey);
  EXPECT_EQ(a->matrix(), fresh.matrix());
  const Rotation other_role(5, 96, RotationRole::kValue);
  const Rotation other_seed(6, 96, RotationRole::kKey);
  EXPECT_NE(a->matrix(), other_role.matrix());
  EXPECT_NE(a->matrix(), other_seed.matrix());
  const Rotation h1(0, 128, RotationRole::kKey), h2(0, 128, RotationRole::kValue);
  EXPECT_EQ(h1.sign_flips(), Rotation(0, 128, RotationRole::kKey).sign_flips());
  EXPECT_NE(h1.sign_flips(), h2.sign_flips());
}

TEST(Rotation, ScalarAndAvx2AreBitIdentical) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (int d : {2, 3, 5, 8, 12, 16, 64, 80, 96, 128, 256, 512}) {
    const auto r = Rotation::get(2, d, RotationRole::kKey);
    const std::vector<float> x = testing::gaussian_matrix(8, d, 77 + d);
    std::vector<float> a(d), b(d);
    for (int t = 0; t < 8; ++t) {
      r->apply(x.data() + t * d, a.data(), Isa::kScalar);
      r->apply(x.data() + t * d, b.data(), Isa::kAvx2);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), 4 * d)) << "apply d " << d;
      r->apply_transpose(x.data() + t * d, a.data(), Isa::kScalar);
      r->apply_transpose(x.data() + t * d, b.data(), Isa::kAvx2);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), 4 * d)) << "transpose d " << d;
    }
  }
}

}  // namespace
}  // namespace turbokv::quant
