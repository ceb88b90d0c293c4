// RoPE scaling (rope_scaling.h). inv_freq[i] = 1 / theta^(2i / dim) before scaling, rounded to
// f32 like transformers' buffers.
#include "model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace turbokv {
namespace {

std::vector<double> base_inv_freq(double theta, int dim) {
  std::vector<double> inv(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    inv[size_t(i)] = 1.0 / std::pow(theta, double(float(2 * i) / float(dim)));
  }
  return inv;
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

RopeTable make_rope_table(const RopeConfig& r, int head_dim, int64_t seq_len) {
  if (r.type == "proportional") {
    // gemma4 global layers: the whole head rotates in rotate_half layout, but only the first
    // partial_rotary_factor of the angle pairs turn (frequencies on the head_dim scale); the
    // rest have frequency 0 and pass through.
    const int angles = int(r.partial_rotary_factor * head_dim / 2);
    RopeTable table;
    table.inv_freq.assign(size_t(head_dim / 2), 0.0f);
    for (int i = 0; i < angles && i < head_dim / 2; ++i) {
      table.inv_freq[size_t(i)] =
          float(1.0 / std::pow(r.theta, double(float(2 * i) / float(head_dim))) / r.factor);
    }
    return table;
  }
  const int dim = int(head_dim * r.partial_rotary_factor);
  const double orig = double(r.original_max_position_embeddings);
  double theta = r.theta;
  if (r.type == "dynamic" && orig > 0 && double(seq_len) > orig) {
    theta *= std::pow(r.factor * double(seq_len) / orig - (r.factor - 1), double(dim) / (dim - 2));
  }
  std::vector<double> inv = base_inv_freq(theta, dim);
  RopeTable table;
  if (r.type == "linear") {
    for (double& f : inv) f /= r.factor;
  } else if (r.type == "llama3") {
    const double low_wavelen = orig / r.low_freq_factor;
    const double high_wavelen = orig / r.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= r.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (orig / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1 - smooth) * f / r.factor + smooth * f;
      }
    }
  } else if (r.type == "yarn") {
    const double base = r.theta;
    auto correction_dim = [&](double rotations) {
      return dim * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;
    for (size_t i = 0; i < inv.size(); ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1 - ramp;
      inv[i] = inv[i] / r.factor * (1 - extrapolation) + inv[i] * extrapolation;
    }
    if (r.attention_factor) {
      table.attention_scaling = float(*r.attention_factor);
    } else if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0) {
      table.attention_scaling =
          float(yarn_mscale(r.factor, *r.mscale) / yarn_mscale(r.factor, *r.mscale_all_dim));
    } else {
      table.attention_scaling = float(yarn_mscale(r.factor, 1));
    }
  }
  table.inv_freq.assign(inv.begin(), inv.end());
  return table;
}

}  // namespace turbokv
