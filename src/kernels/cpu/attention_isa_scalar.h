// Portable vector primitives of the attention core (attention_core.h): plain loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/attention_core.h"

namespace turbokv::attention_detail {

struct ScalarIsa {
  // out[t] = <q, keys[t]> for t < n; keys [n, d].
  template <int D>
  static void dot_rows(const float* q, const float* keys, int n, int d, float* out) {
    for (int t = 0; t < n; ++t) {
      float sum = 0;
      for (int c = 0; c < d; ++c) sum += q[c] * keys[static_cast<int64_t>(t) * d + c];
      out[t] = sum;
    }
  }

  // scores[b][t] = <q_b, keys[t]> for b < rows (q [rows, d], scores [rows, kTileTokens]).
  template <int D>
  static void dot_block(int rows, const float* q, const float* keys, int n, int d, float* scores) {
    for (int b = 0; b < rows; ++b) dot_rows<D>(q + b * d, keys, n, d, scores + b * kTileTokens);
  }
  // acc[b] = acc[b] * alpha[b] + sum_t w[b][t] * values[t] for b < rows (acc [rows, d],
  // w [rows, kTileTokens]).
  template <int D>
  static void accumulate_block(int rows, float* acc, const float* alpha, const float* w,
                               const float* values, int n, int d) {
    for (int b = 0; b < rows; ++b) {
      scale_accumulate<D>(acc + b * d, alpha[b], w + b * kTileTokens, values, n, d);
    }
  }

  // s[t] *= scale * token_scale[t] (token_scale may be null), for the kTileTokens entries.
  static void scale_scores(float* s, const float* token_scale, float scale) {
    for (int t = 0; t < kTileTokens; ++t) {
      s[t] = token_scale != nullptr ? s[t] * token_scale[t] * scale : s[t] * scale;
    }
  }
  static float max_score(const float* s) {
    float m = s[0];
    for (int t = 1; t < kTileTokens; ++t) m = std::max(m, s[t]);
    return m;
  }
  // out[t] = a[t] * b[t] for the kTileTokens entries.
  static void multiply(const float* a, const float* b, float* out) {
    for (int t = 0; t < kTileTokens; ++t) out[t] = a[t] * b[t];
  }

  // s[t] := exp(s[t] - m) for the kTileTokens entries (-inf -> 0); returns their sum.
  static float exp_shifted(float* s, float m) {
    float sum = 0;
    for (int t = 0; t < kTileTokens; ++t) {
      s[t] = std::exp(s[t] - m);
      sum += s[t];
    }
    return sum;
  }

  // acc[d] = acc * alpha + sum_t p[t] * values[t]; values [n, d].
  template <int D>
  static void scale_accumulate(float* acc, float alpha, const float* p, const float* values, int n,
                               int d) {
    for (int c = 0; c < d; ++c) acc[c] *= alpha;
    for (int t = 0; t < n; ++t) {
      for (int c = 0; c < d; ++c) acc[c] += p[t] * values[static_cast<int64_t>(t) * d + c];
    }
  }

  static void f16_to_f32(const uint16_t* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = turbokv::f16_to_f32(in[i]);
  }
  static void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = turbokv::bf16_to_f32(in[i]);
  }
};

}  // namespace turbokv::attention_detail
