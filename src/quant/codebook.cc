// Lloyd-Max iteration on the exact coordinate density of a random unit vector. With
// t = sin θ the density becomes ∝ cos^(d-2) θ dθ on [-π/2, π/2], so every interval integral
// has a closed form or a short stable recurrence:
//   mass:  ∫ cos^k θ dθ          via I_k = [cos^(k-1) θ sin θ]/k + (k-1)/k I_(k-2)
//   first: ∫ sin θ cos^k θ dθ    = [-cos^(k+1) θ / (k+1)]
// Centroid = first / mass per interval; boundaries = midpoints; solved to ~1e-15.
#include "quant/codebook.h"

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace turbokv::quant {
namespace {

// ∫_{θa}^{θb} cos^k θ dθ for integer k >= 0 (upward recurrence: errors are damped by (k-1)/k).
double cos_power_integral(int k, double theta_a, double theta_b) {
  const double sa = std::sin(theta_a), ca = std::cos(theta_a);
  const double sb = std::sin(theta_b), cb = std::cos(theta_b);
  double even = theta_b - theta_a;  // I_0
  double odd = sb - sa;             // I_1
  if (k == 0) return even;
  if (k == 1) return odd;
  double pow_a = ca, pow_b = cb;  // cos^(m-1) for m = 2: cos^1
  double result = 0;
  for (int m = 2; m <= k; ++m) {
    const double boundary = (pow_b * sb - pow_a * sa) / m;
    double& prev = (m % 2 == 0) ? even : odd;
    prev = boundary + double(m - 1) / m * prev;
    result = prev;
    pow_a *= ca;
    pow_b *= cb;
  }
  return result;
}

// ∫_{θa}^{θb} sin θ cos^k θ dθ.
double first_moment_integral(int k, double theta_a, double theta_b) {
  return (std::pow(std::cos(theta_a), k + 1) - std::pow(std::cos(theta_b), k + 1)) / (k + 1);
}

// Centroid of [a, b] (t units) and its derivatives with respect to a and b:
// dc/db = f(b) (b - c) / P, dc/da = f(a) (c - a) / P (P = mass, f unnormalized like P).
struct IntervalStats {
  double centroid, mass, d_lower, d_upper;
};

IntervalStats interval_stats(int k, double a, double b) {
  const double theta_a = std::asin(a), theta_b = std::asin(b);
  IntervalStats s;
  s.mass = cos_power_integral(k, theta_a, theta_b);
  if (!(s.mass > 0)) {  // underflow far in a tail: midpoint, frozen
    s.centroid = 0.5 * (a + b);
    s.d_lower = s.d_upper = 0;
    return s;
  }
  s.centroid = first_moment_integral(k, theta_a, theta_b) / s.mass;
  // density in t: (1 - t²)^((d-3)/2) = cos^(k-1) θ
  const double f_a = std::pow(std::cos(theta_a), k - 1), f_b = std::pow(std::cos(theta_b), k - 1);
  s.d_lower = a <= -1 ? 0 : f_a * (s.centroid - a) / s.mass;
  s.d_upper = b >= 1 ? 0 : f_b * (b - s.centroid) / s.mass;
  return s;
}

// Lloyd-Max: boundaries m_1..m_{L-1} with m_j = (c_j + c_{j+1}) / 2. A few hundred plain
// Lloyd steps from equal-mass intervals, then Newton on the tridiagonal system
// F_j(m) = m_j - (c_{j-1}(m_{j-1}, m_j) + c_j(m_j, m_{j+1})) / 2 = 0 (Lloyd alone converges
// linearly at a rate near 1 for many levels).
std::unique_ptr<Codebook> compute_codebook(int dim, int bits) {
  const int levels = 1 << bits;
  const int k = dim - 2;  // density exponent in θ
  const double half_pi = 1.5707963267948966;
  const double total_mass = cos_power_integral(k, -half_pi, half_pi);

  std::vector<double> bounds(levels + 1);  // [levels + 1] interval ends in t, bounds[0] = -1
  bounds[0] = -1;
  bounds[levels] = 1;
  for (int j = 1; j < levels; ++j) {  // equal-mass start, by bisection on the mass
    const double target = total_mass * j / levels;
    double lo = -half_pi, hi = half_pi;
    for (int it = 0; it < 100; ++it) {
      const double mid = 0.5 * (lo + hi);
      (cos_power_integral(k, -half_pi, mid) < target ? lo : hi) = mid;
    }
    bounds[j] = std::sin(0.5 * (lo + hi));
  }

  std::vector<IntervalStats> stats(levels);
  auto update_stats = [&] {
    for (int j = 0; j < levels; ++j) stats[j] = interval_stats(k, bounds[j], bounds[j + 1]);
  };
  auto residual = [&](int j) {
    return bounds[j] - 0.5 * (stats[j - 1].centroid + stats[j].centroid);
  };
  auto max_residual = [&] {
    double r = 0;
    for (int j = 1; j < levels; ++j) r = std::max(r, std::abs(residual(j)));
    return r;
  };

  update_stats();
  int iterations = 0;
  for (; iterations < 300 && max_residual() > 1e-6 / std::sqrt(double(dim)); ++iterations) {
    for (int j = 1; j < levels; ++j) {
      bounds[j] = 0.5 * (stats[j - 1].centroid + stats[j].centroid);
    }
    update_stats();
  }
  // Newton with a Thomas solve of the tridiagonal Jacobian; halve the step until the
  // residual drops and the boundaries stay ordered.
  const int n = levels - 1;
  std::vector<double> lower(n), diag(n), upper(n), rhs(n), step(n);
  for (int newton = 0; newton < 100 && n > 0; ++newton, ++iterations) {
    const double current = max_residual();
    if (current < 1e-15) break;
    for (int r = 0; r < n; ++r) {
      const int j = r + 1;
      diag[r] = 1 - 0.5 * (stats[j - 1].d_upper + stats[j].d_lower);
      lower[r] = -0.5 * stats[j - 1].d_lower;
      upper[r] = -0.5 * stats[j].d_upper;
      rhs[r] = -residual(j);
    }
    for (int r = 1; r < n; ++r) {
      const double factor = lower[r] / diag[r - 1];
      diag[r] -= factor * upper[r - 1];
      rhs[r] -= factor * rhs[r - 1];
    }
    step[n - 1] = rhs[n - 1] / diag[n - 1];
    for (int r = n - 2; r >= 0; --r) step[r] = (rhs[r] - upper[r] * step[r + 1]) / diag[r];
    const std::vector<double> saved = bounds;
    double scale = 1;
    bool improved = false;
    for (int tries = 0; tries < 30 && !improved; ++tries, scale *= 0.5) {
      bool ordered = true;
      for (int r = 0; r < n; ++r) bounds[r + 1] = saved[r + 1] + scale * step[r];
      for (int j = 0; j < levels; ++j) ordered = ordered && bounds[j] < bounds[j + 1];
      if (!ordered) continue;
      update_stats();
      improved = max_residual() < current;
    }
    if (!improved) {
      bounds = saved;
      update_stats();
      break;
    }
  }
  std::vector<double> centroids(levels), masses(levels);
  for (int j = 0; j < levels; ++j) {
    centroids[j] = stats[j].centroid;
    masses[j] = stats[j].mass / total_mass;
  }

  auto book = std::make_unique<Codebook>();
  book->dim = dim;
  book->bits = bits;
  book->iterations = iterations;
  book->centroids.resize(levels);
  // Symmetrize exactly: average each pair so c[k] == -c[levels-1-k] bit for bit.
  for (int j = 0; j < levels / 2; ++j) {
    const double magnitude = 0.5 * (centroids[levels - 1 - j] - centroids[j]);
    book->centroids[j] = float(-magnitude);
    book->centroids[levels - 1 - j] = float(magnitude);
  }
  book->boundaries.resize(levels - 1);
  for (int j = 0; j + 1 < levels; ++j) {
    book->boundaries[j] = float((double(book->centroids[j]) + double(book->centroids[j + 1])) / 2);
  }
  // E(t - c)² summed over intervals = E t² - Σ c_j² P_j at the centroid condition; E t² = 1/d.
  double captured = 0;
  for (int j = 0; j < levels; ++j) captured += centroids[j] * centroids[j] * masses[j];
  book->unit_mse = 1.0 - dim * captured;
  return book;
}

}  // namespace

const Codebook& lloyd_max_codebook(int dim, int bits) {
  if (dim < 2) {
    throw InvalidArgument(str_cat("codebook dimension ", dim, " is invalid: need d >= 2"));
  }
  if (bits < 1 || bits > 8) {
    throw InvalidArgument(str_cat("codebook bits ", bits, " is invalid: allowed 1..8"));
  }
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::unique_ptr<Codebook>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{dim, bits}];
  if (!slot) slot = compute_codebook(dim, bits);
  return *slot;
}

}  // namespace turbokv::quant
