// The slow reference for every attention kernel: per query and head, scores over all visible
// keys, a two-pass softmax, then the weighted sum of values. Scalar, fp32 accumulation.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/attention.h"

namespace turbokv {

const char* kv_dtype_name(KVDType dtype) {
  switch (dtype) {
    case KVDType::kF32:
      return "f32";
    case KVDType::kF16:
      return "f16";
    case KVDType::kBF16:
      return "bf16";
  }
  return "?";
}

size_t kv_dtype_bytes(KVDType dtype) {
  return dtype == KVDType::kF32 ? 4 : 2;
}

namespace {

float load_element(KVDType dtype, const void* base, int64_t index) {
  switch (dtype) {
    case KVDType::kF32:
      return static_cast<const float*>(base)[index];
    case KVDType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[index]);
    case KVDType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[index]);
  }
  return 0;
}

}  // namespace

void attention_reference(const DenseKVView& kv, const AttentionQueries& queries,
                         const AttentionParams& params, float* out, float* lse) {
  const int d = kv.head_dim;
  const int group = params.n_heads / kv.kv_heads;
  std::vector<float> scores(static_cast<size_t>(kv.n_tokens));
  for (int i = 0; i < queries.n_q; ++i) {
    const int64_t q_pos = queries.first_pos + i;
    for (int h = 0; h < params.n_heads; ++h) {
      const float* q = queries.q + (static_cast<int64_t>(i) * params.n_heads + h) * d;
      float* o = out + (static_cast<int64_t>(i) * params.n_heads + h) * d;
      const int64_t head_base = static_cast<int64_t>(h / group) * kv.head_stride;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        if (!attention_visible(q_pos, kv.first_pos + t, params.sliding_window)) continue;
        float dot = 0;
        for (int c = 0; c < d; ++c)
          dot += q[c] * load_element(kv.dtype, kv.k, (head_base + t) * d + c);
        float s = params.scale * dot;
        if (params.logit_softcap > 0)
          s = params.logit_softcap * std::tanh(s / params.logit_softcap);
        scores[t] = s;
        max_score = std::max(max_score, s);
      }
      std::fill(o, o + d, 0.0f);
      float* row_lse =
          lse != nullptr ? lse + static_cast<int64_t>(i) * params.n_heads + h : nullptr;
      if (row_lse != nullptr) *row_lse = max_score;  // -inf when no key is visible
      if (max_score == -std::numeric_limits<float>::infinity()) continue;
      float sum = 0;
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        if (!attention_visible(q_pos, kv.first_pos + t, params.sliding_window)) continue;
        const float p = std::exp(scores[t] - max_score);
        sum += p;
        for (int c = 0; c < d; ++c)
          o[c] += p * load_element(kv.dtype, kv.v, (head_base + t) * d + c);
      }
      for (int c = 0; c < d; ++c) o[c] /= sum;
      if (row_lse != nullptr) *row_lse = max_score + std::log(sum);
    }
  }
}

}  // namespace turbokv
