// Random quantized weight matrices for the kernel tests: random code bytes in any format of
// kernels/cpu/qweights.h, with finite moderate scales (f16 block scales in [0.001, 0.02];
// MLX scales in that range and biases in [-0.08, -0.004], stored as bf16 or f16), so every
// value dequantizes to a finite number.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/matmul.h"

namespace turbokv::testing {

struct RandomWeight {
  std::vector<uint8_t> data, scales, biases;
  WeightMatrix w;  // points into the vectors above
};

inline void put_u16(std::vector<uint8_t>& bytes, size_t at, uint16_t v) {
  std::memcpy(bytes.data() + at, &v, 2);
}

// bits, group_size and scale_dtype apply to kAffine only.
inline RandomWeight random_weight(WeightFormat format, int bits, int64_t rows, int64_t cols,
                                  uint32_t seed, int group_size = 64,
                                  DType scale_dtype = DType::BF16) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  RandomWeight r;
  r.w = WeightMatrix{DType::BF16, nullptr, rows, cols};
  r.w.format = format;
  if (format == WeightFormat::kAffine) {
    r.w.affine = AffineParams{nullptr, nullptr, scale_dtype, bits, group_size};
  }
  r.data.resize(size_t(rows * r.w.row_bytes()));
  for (uint8_t& v : r.data) v = uint8_t(gen());
  if (format == WeightFormat::kAffine) {
    const int64_t groups = rows * cols / group_size;
    r.scales.resize(size_t(2 * groups));
    r.biases.resize(size_t(2 * groups));
    const auto store = [&](float v) {
      return scale_dtype == DType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
    };
    for (int64_t g = 0; g < groups; ++g) {
      put_u16(r.scales, size_t(2 * g), store(scale(gen)));
      put_u16(r.biases, size_t(2 * g), store(-scale(gen) * 4));
    }
    r.w.affine.scales = r.scales.data();
    r.w.affine.biases = r.biases.data();
  } else {
    const BlockGeometry g = block_geometry(format);
    for (size_t at = 0; at < r.data.size(); at += size_t(g.bytes)) {
      if (format == WeightFormat::kQ6_K) {
        put_u16(r.data, at + 208, f32_to_f16(scale(gen)));
      } else {
        put_u16(r.data, at, f32_to_f16(scale(gen)));
        if (format == WeightFormat::kQ4_K) put_u16(r.data, at + 2, f32_to_f16(scale(gen)));
      }
    }
  }
  r.w.data = r.data.data();
  return r;
}

}  // namespace turbokv::testing
