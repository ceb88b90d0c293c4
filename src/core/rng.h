// Deterministic random numbers for codec state (rotation signs, rotation matrices, the QJL
// matrix). Integer outputs are bit-identical on every platform: splitmix64 seeds a
// xoshiro256** generator (both by Vigna, public-domain algorithms, written here from their
// definitions). Gaussians use Box-Muller in double precision (libm log/cos/sin), so matrices
// built from them should be copied from the CPU, not regenerated, by other backends.
#pragma once

#include <cmath>
#include <cstdint>

namespace turbokv {

// One step of splitmix64: advances *state and returns the mixed output.
inline uint64_t splitmix64_next(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The seed of the stream that belongs to (seed, dim, role): codec state is a pure function
// of these three numbers.
inline uint64_t derive_seed(uint64_t seed, uint64_t dim, uint64_t role) {
  uint64_t s = seed;
  uint64_t mixed = splitmix64_next(&s);
  s = mixed ^ (dim * 0xD1B54A32D192ED03ull);
  mixed = splitmix64_next(&s);
  s = mixed ^ (role * 0x8CB92BA72F3D8DD7ull);
  return splitmix64_next(&s);
}

// xoshiro256**: state seeded with four splitmix64 outputs.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    uint64_t sm = seed;
    for (auto& word : s_) word = splitmix64_next(&sm);
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

  // Standard normal by Box-Muller; the second value of each pair is kept for the next call.
  double gaussian() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 6.283185307179586 * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace turbokv
