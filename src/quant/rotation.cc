// Rotation construction (signs / Gram-Schmidt) and the scalar reference transforms.
#include "quant/rotation.h"

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "core/rng.h"

namespace turbokv::quant {
namespace {

// y = M x with M row-major [dim, dim], j ascending, product then add (the documented order).
void dense_matvec_ref(const float* matrix, const float* in, float* out, int dim) {
  for (int i = 0; i < dim; ++i) {
    const float* row = matrix + size_t(i) * dim;
    float acc = 0.0f;
    for (int j = 0; j < dim; ++j) {
      const float product = row[j] * in[j];
      acc = acc + product;
    }
    out[i] = acc;
  }
}

}  // namespace

void fwht_ref(float* z, int dim) {
  for (int h = 1; h < dim; h *= 2) {
    for (int i = 0; i < dim; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = z[j], b = z[j + h];
        z[j] = a + b;
        z[j + h] = a - b;
      }
    }
  }
}

Rotation::Rotation(uint64_t seed, int dim, RotationRole role) : dim_(dim) {
  Xoshiro256 rng(derive_seed(seed, uint64_t(dim), uint64_t(role)));
  hadamard_ = is_power_of_two(dim);
  if (hadamard_) {
    sign_flips_.resize(dim);
    sign_masks_.resize(dim);
    for (int i = 0; i < dim; ++i) {
      sign_flips_[i] = uint8_t(rng.next() >> 63);
      sign_masks_[i] = sign_flips_[i] ? 0x80000000u : 0u;
    }
    scale_ = float(1.0 / std::sqrt(double(dim)));
    return;
  }
  // columns[c][r] = G[r][c]
  std::vector<double> g(size_t(dim) * dim);  // [dim, dim] row-major
  for (auto& v : g) v = rng.gaussian();
  std::vector<std::vector<double>> columns(dim, std::vector<double>(dim));
  for (int r = 0; r < dim; ++r) {
    for (int c = 0; c < dim; ++c) columns[c][r] = g[size_t(r) * dim + c];
  }
  for (int c = 0; c < dim; ++c) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int p = 0; p < c; ++p) {
        double dot = 0;
        for (int r = 0; r < dim; ++r) dot += columns[p][r] * columns[c][r];
        for (int r = 0; r < dim; ++r) columns[c][r] -= dot * columns[p][r];
      }
    }
    double norm = 0;
    for (int r = 0; r < dim; ++r) norm += columns[c][r] * columns[c][r];
    norm = std::sqrt(norm);
    for (int r = 0; r < dim; ++r) columns[c][r] /= norm;
  }
  // R = Q^T: row i of R is column i of Q.
  matrix_.resize(size_t(dim) * dim);
  matrix_t_.resize(size_t(dim) * dim);
  for (int i = 0; i < dim; ++i) {
    for (int j = 0; j < dim; ++j) {
      matrix_[size_t(i) * dim + j] = float(columns[i][j]);
      matrix_t_[size_t(j) * dim + i] = float(columns[i][j]);
    }
  }
}

std::shared_ptr<const Rotation> Rotation::get(uint64_t seed, int dim, RotationRole role) {
  if (dim < 1)
    throw InvalidArgument(str_cat("rotation dimension ", dim, " is invalid: need d >= 1"));
  static std::mutex mu;
  static std::map<std::tuple<uint64_t, int, uint32_t>, std::shared_ptr<const Rotation>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{seed, dim, uint32_t(role)}];
  if (!slot) slot = std::make_shared<const Rotation>(seed, dim, role);
  return slot;
}

void Rotation::apply(const float* in, float* out, Isa isa) const {
  isa = usable_isa(isa);
  if (hadamard_) {
    for (int i = 0; i < dim_; ++i) out[i] = sign_flips_[i] ? -in[i] : in[i];
    if (isa == Isa::kAvx2 && dim_ >= 8) {
      avx2::fwht(out, dim_);
    } else {
      fwht_ref(out, dim_);
    }
    for (int i = 0; i < dim_; ++i) out[i] = out[i] * scale_;
    return;
  }
  // avx2::dense_matvec takes the transposed layout (column j of M contiguous), so pass R^T.
  if (isa == Isa::kAvx2) {
    avx2::dense_matvec(matrix_t_.data(), in, out, dim_);
  } else {
    dense_matvec_ref(matrix_.data(), in, out, dim_);
  }
}

void Rotation::apply_transpose(const float* in, float* out, Isa isa) const {
  isa = usable_isa(isa);
  if (hadamard_) {
    if (out != in) std::copy(in, in + dim_, out);
    if (isa == Isa::kAvx2 && dim_ >= 8) {
      avx2::fwht(out, dim_);
    } else {
      fwht_ref(out, dim_);
    }
    for (int i = 0; i < dim_; ++i) {
      const float scaled = out[i] * scale_;
      out[i] = sign_flips_[i] ? -scaled : scaled;
    }
    return;
  }
  if (isa == Isa::kAvx2) {
    avx2::dense_matvec(matrix_.data(), in, out, dim_);
  } else {
    dense_matvec_ref(matrix_t_.data(), in, out, dim_);
  }
}

}  // namespace turbokv::quant
