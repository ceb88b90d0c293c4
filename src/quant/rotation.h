// Random orthogonal rotations R of R^d, deterministic from (seed, d, role) (docs/design.md,
// "TurboQuant").
//  - d a power of two (>= 2): randomized Hadamard, R u = H_d (s ⊙ u) · (1/√d).
//  - otherwise: dense Haar-random orthogonal matrix (Gram-Schmidt QR of a Gaussian matrix,
//    which equals Householder QR with columns sign-fixed by sign(diag(R_qr))).
//
// Exact float operation order (scalar reference == AVX2 == CUDA, bit for bit):
//  Hadamard apply(u):  z_i = s_i ? -u_i : u_i;
//                      for h = 1, 2, 4, ..., d/2 (in this order), for every pair (i, i+h) with
//                      (i & h) == 0: (z_i, z_{i+h}) = (z_i + z_{i+h}, z_i - z_{i+h});
//                      y_i = z_i * scale, scale = float(1 / sqrt(double(d))).
//  Hadamard apply_transpose(y): the same butterflies on y, then * scale, then the sign flip.
//  Dense apply(u):     y_i = (((0 + R[i][0]*u_0) + R[i][1]*u_1) + ...) + R[i][d-1]*u_{d-1}
//                      (each product rounded, then added, j ascending; no FMA).
//  Dense apply_transpose(y): x_j = Σ_i R[i][j]*y_i the same way, i ascending.
// Signs: s_i = top bit of the i-th xoshiro256** output seeded with derive_seed(seed, d, role).
// Dense: Gaussian matrix G (row-major, i-th gaussian() is G[i / d][i % d]) from that stream,
// Q from modified Gram-Schmidt on G's columns in double (twice, for orthogonality),
// R = Q^T rounded to float.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "quant/isa.h"

namespace turbokv::quant {

// Which vectors a rotation is for: keys and values of one layer use different rotations, the
// two halves of a split codec theirs, and the QJL projection its own stream.
enum class RotationRole : uint32_t {
  kKey = 0,
  kValue = 1,
  kKeySplitHigh = 2,
  kKeySplitLow = 3,
  kValueSplitHigh = 4,
  kValueSplitLow = 5,
  kQjl = 6,
};

class Rotation {
 public:
  // Cached process-wide (thread-safe). Throws InvalidArgument for dim < 1.
  static std::shared_ptr<const Rotation> get(uint64_t seed, int dim, RotationRole role);

  int dim() const { return dim_; }
  bool is_hadamard() const { return hadamard_; }
  // Hadamard only: [dim] 1 where the sign flips.
  const std::vector<uint8_t>& sign_flips() const { return sign_flips_; }
  // Hadamard only: [dim] 0x80000000 where the sign flips, else 0 (XOR masks for SIMD).
  const std::vector<uint32_t>& sign_masks() const { return sign_masks_; }
  float hadamard_scale() const { return scale_; }
  // Dense only: [dim, dim] row-major R (y = R u); and its transpose [dim, dim] (R^T).
  const std::vector<float>& matrix() const { return matrix_; }
  const std::vector<float>& matrix_transposed() const { return matrix_t_; }

  // out = R in / out = R^T in. in and out may alias (Hadamard) — not for dense.
  void apply(const float* in, float* out, Isa isa = best_isa()) const;
  void apply_transpose(const float* in, float* out, Isa isa = best_isa()) const;

  Rotation(uint64_t seed, int dim, RotationRole role);  // use get()

 private:
  int dim_ = 0;
  bool hadamard_ = false;
  float scale_ = 1;
  std::vector<uint8_t> sign_flips_;   // [dim]
  std::vector<uint32_t> sign_masks_;  // [dim]
  std::vector<float> matrix_;         // [dim, dim] R, row-major
  std::vector<float> matrix_t_;       // [dim, dim] R^T, row-major
};

inline bool is_power_of_two(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}

// Scalar reference kernels (exact order above); the AVX2 versions live in codec_avx2.cc.
void fwht_ref(float* z, int dim);  // in-place butterflies only (no scale)
namespace avx2 {
void fwht(float* z, int dim);  // dim a power of two >= 8
void dense_matvec(const float* matrix_t, const float* in, float* out, int dim);  // out = M in
}  // namespace avx2

}  // namespace turbokv::quant
