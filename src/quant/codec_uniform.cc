// Uniform affine group codec: scalar reference (order documented in codec_uniform.h) and
// dispatch to AVX2.
#include "quant/codec_uniform.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"

namespace turbokv::quant {
namespace {

int checked_uniform_bits(int bits) {
  if (bits < 2 || bits > 8) {
    throw InvalidArgument(str_cat("uniform codec bits ", bits, " is invalid: allowed 2..8"));
  }
  return bits;
}

int checked_group_size(int group_size) {
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    throw InvalidArgument(
        str_cat("uniform group size ", group_size, " is invalid: allowed 32, 64, 128"));
  }
  return group_size;
}

}  // namespace

UniformCodec::UniformCodec(const UniformCodecConfig& config)
    : layout_(make_packed_layout(config.dim, checked_uniform_bits(config.bits))),
      group_size_(checked_group_size(config.group_size)) {}

void UniformCodec::quantize(const float* x, uint8_t* codes, uint16_t* params, Isa isa) const {
  if (usable_isa(isa) == Isa::kAvx2) {
    avx2::uniform_quantize(*this, x, codes, params);
    return;
  }
  const int d = dim();
  thread_local std::vector<uint8_t> q;
  q.resize(d);
  for (int g = 0; g < groups(); ++g) {
    const int begin = g * group_size_, end = std::min(d, begin + group_size_);
    float mn = x[begin], mx = x[begin];
    for (int i = begin + 1; i < end; ++i) {
      mn = std::fmin(mn, x[i]);
      mx = std::fmax(mx, x[i]);
    }
    const UniformGroupScale scale = uniform_group_params(mn, mx, bits(), params + 2 * g);
    uniform_group_codes(x, begin, end, scale, q.data());
  }
  pack_codes(q.data(), d, bits(), codes);
}

UniformGroupScale uniform_group_params(float mn, float mx, int bits, uint16_t* params) {
  UniformGroupScale scale;
  scale.top = float((1 << bits) - 1);
  mn = mn + 0.0f;
  mx = mx + 0.0f;
  params[0] = f32_to_f16((mx - mn) / scale.top);
  params[1] = f32_to_f16(mn);
  const float s = f16_to_f32(params[0]);
  scale.min = f16_to_f32(params[1]);
  scale.inv_scale = s > 0 ? 1.0f / s : 0.0f;
  return scale;
}

void uniform_group_codes(const float* x, int begin, int end, const UniformGroupScale& scale,
                         uint8_t* q) {
  for (int i = begin; i < end; ++i) {
    const float level = std::floor((x[i] - scale.min) * scale.inv_scale + 0.5f);
    q[i] = uint8_t(std::fmin(std::fmax(level, 0.0f), scale.top));
  }
}

void UniformCodec::dequantize(const uint8_t* codes, const uint16_t* params, float* x) const {
  for (int i = 0; i < dim(); ++i) {
    const int g = i / group_size_;
    const float s = f16_to_f32(params[2 * g]), m = f16_to_f32(params[2 * g + 1]);
    x[i] = s * float(packed_code_at(codes, bits(), i)) + m;
  }
}

void UniformCodec::quantize_batch(const float* x, int64_t n, uint8_t* codes, uint16_t* params,
                                  Isa isa) const {
  parallel_for(n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      quantize(x + t * dim(), codes + t * code_bytes(), params + t * params_per_vector(), isa);
    }
  });
}

void UniformCodec::dequantize_batch(const uint8_t* codes, const uint16_t* params, int64_t n,
                                    float* x) const {
  parallel_for(n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      dequantize(codes + t * code_bytes(), params + t * params_per_vector(), x + t * dim());
    }
  });
}

void UniformCodec::score(const float* q, const uint8_t* codes, const uint16_t* params, int64_t n,
                         float* scores, Isa isa) const {
  if (usable_isa(isa) == Isa::kAvx2) {
    avx2::uniform_score(*this, q, codes, params, n, scores);
    return;
  }
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = codes + t * code_bytes();
    const uint16_t* p = params + t * params_per_vector();
    float total = 0;
    for (int g = 0; g < groups(); ++g) {
      const int begin = g * group_size_, end = std::min(dim(), begin + group_size_);
      float dot = 0, q_sum = 0;
      for (int i = begin; i < end; ++i) {
        dot += q[i] * float(packed_code_at(row, bits(), i));
        q_sum += q[i];
      }
      total += f16_to_f32(p[2 * g]) * dot + f16_to_f32(p[2 * g + 1]) * q_sum;
    }
    scores[t] = total;
  }
}

void UniformCodec::accumulate(const float* weights, const uint8_t* codes, const uint16_t* params,
                              int64_t n, float* acc, Isa isa) const {
  if (usable_isa(isa) == Isa::kAvx2) {
    avx2::uniform_accumulate(*this, weights, codes, params, n, acc);
    return;
  }
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = codes + t * code_bytes();
    const uint16_t* p = params + t * params_per_vector();
    for (int i = 0; i < dim(); ++i) {
      const int g = i / group_size_;
      const float value =
          f16_to_f32(p[2 * g]) * float(packed_code_at(row, bits(), i)) + f16_to_f32(p[2 * g + 1]);
      acc[i] += weights[t] * value;
    }
  }
}

}  // namespace turbokv::quant
