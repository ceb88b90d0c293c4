// The backend-consistency harness for attention (docs/development.md, "Backend-consistency
// harness"): a case declares shapes and masks; every implementation runs it and is compared with
// the slow reference, norm-scaled (max |got - expected| <= tol * ||expected row||), plus NaN/Inf
// checks and a canary after the output buffer that catches writes past the end.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_codes.h"
#include "tests/common/random.h"

namespace turbokv::testing {

struct AttentionCase {
  int head_dim = 128;
  int kv_heads = 2;
  int group = 4;       // query heads per KV head
  int64_t n_past = 0;  // tokens before the queries' chunk
  int n_q = 1;         // queries = the newest n_q tokens (the chunk)
  int window = 0;
  float softcap = 0;

  int n_heads() const { return kv_heads * group; }
  int64_t n_tokens() const { return n_past + n_q; }
  AttentionParams params() const {
    return AttentionParams{n_heads(), 1.0f / std::sqrt(float(head_dim)), softcap, window};
  }
  std::string name() const {
    return "d" + std::to_string(head_dim) + " kvh" + std::to_string(kv_heads) + " g" +
           std::to_string(group) + " past" + std::to_string(n_past) + " nq" + std::to_string(n_q) +
           " w" + std::to_string(window) + " cap" + std::to_string(int(softcap));
  }
};

// The shared case list: every d in {64, 96, 128, 256} and GQA group 1/4/8, contexts crossing
// the tile (16), query block (16) and split (512) boundaries, causal and sliding masks,
// decode and prefill, soft-capping.
inline std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> cases;
  for (int d : {64, 96, 128, 256}) {
    for (int group : {1, 4, 8}) {
      cases.push_back({d, 2, group, 0, 1});
      cases.push_back({d, 2, group, 16, 1});
      cases.push_back({d, 2, group, 530, 1});
      cases.push_back({d, 1, group, 1030, 1, 0, 30.0f});
      cases.push_back({d, 2, group, 0, 17});
      cases.push_back({d, 2, group, 511, 33, 100});
    }
  }
  for (int64_t past : {14, 15, 16, 31, 500, 511, 512, 513, 1024})
    cases.push_back({128, 2, 4, past, 1});
  for (int n_q : {2, 15, 16, 17, 40}) cases.push_back({64, 2, 2, 29, n_q, 0, 0});
  cases.push_back({128, 2, 4, 700, 1, 64});       // decode with a window
  cases.push_back({128, 2, 4, 50, 300, 48});      // chunk much longer than the window
  cases.push_back({16, 2, 2, 40, 24, 8, 50.0f});  // hf-tiny shape: d 16, gemma2 cap, window 8
  cases.push_back({40, 1, 3, 37, 5});             // d not a multiple of 8: scalar only
  // Decode with every GQA group size up to and past the 8 rows of one decode pass, head dims
  // with an odd number of 8-lane groups, a tail block of one key.
  for (int group : {2, 3, 5, 6, 7, 16}) cases.push_back({128, 2, group, 300, 1});
  for (int d : {80, 112}) cases.push_back({d, 2, 4, 96, 1});
  cases.push_back({64, 1, 2, 32, 1, 0, 20.0f});
  return cases;
}

// Every instruction set a test runs (one the CPU lacks runs the next one below it).
// The TurboQuant decode kernel's products for the scope of a test: tests of the cache types and
// levers hold them to the exact kernel's tolerance; turboquant_decode_test covers the 8-bit ones.
class ScopedCodeProducts {
 public:
  explicit ScopedCodeProducts(CodeProducts products) : before_(code_products()) {
    set_code_products(products);
  }
  ~ScopedCodeProducts() { set_code_products(before_); }
  ScopedCodeProducts(const ScopedCodeProducts&) = delete;
  ScopedCodeProducts& operator=(const ScopedCodeProducts&) = delete;

 private:
  CodeProducts before_;
};

inline constexpr AttentionIsa kAllIsas[] = {AttentionIsa::kScalar, AttentionIsa::kAvx2,
                                            AttentionIsa::kAvx512};

// Random post-RoPE-like inputs of a case: k, v [n_tokens, kv_heads, d], q [n_q, n_heads, d].
struct AttentionInputs {
  std::vector<float> k, v, q;
};
inline AttentionInputs make_inputs(const AttentionCase& c, uint32_t seed) {
  AttentionInputs in;
  const size_t kv = size_t(c.n_tokens()) * c.kv_heads * c.head_dim;
  in.k = random_normal(kv, seed);
  in.v = random_normal(kv, seed + 1);
  // Scaled queries give peaked softmaxes (scores up to ~10), the hard case for accuracy.
  in.q = random_normal(size_t(c.n_q) * c.n_heads() * c.head_dim, seed + 2, 2.0f);
  return in;
}

constexpr float kCanary = 12345.678f;
constexpr int kCanaryFloats = 64;

// An output buffer [n_q, n_heads, d] followed by canaries.
inline std::vector<float> output_buffer(const AttentionCase& c) {
  std::vector<float> out(size_t(c.n_q) * c.n_heads() * c.head_dim + kCanaryFloats, kCanary);
  return out;
}

// Compares per output row; tol is relative to that row's norm.
inline void expect_attention_close(const AttentionCase& c, const std::vector<float>& expected,
                                   const std::vector<float>& got, double tol,
                                   const std::string& backend) {
  const size_t n = size_t(c.n_q) * c.n_heads() * c.head_dim;
  for (size_t i = n; i < got.size(); ++i) {
    ASSERT_EQ(got[i], kCanary) << backend << " wrote past the end, " << c.name();
  }
  double worst = 0;
  for (size_t row = 0; row < n / c.head_dim; ++row) {
    double norm = 0, err = 0;
    for (int j = 0; j < c.head_dim; ++j) {
      const float g = got[row * c.head_dim + j];
      ASSERT_TRUE(std::isfinite(g)) << backend << " row " << row << ", " << c.name();
      const double e = expected[row * c.head_dim + j];
      norm += e * e;
      err = std::max(err, std::abs(g - e));
    }
    worst = std::max(worst, err / std::max(std::sqrt(norm), 1e-30));
  }
  EXPECT_LE(worst, tol) << backend << ", " << c.name();
}

// Double-precision attention over an f32 view (two-pass softmax, every sum in double): the
// yardstick the accuracy of every kernel is stated against. out [n_q, n_heads, head_dim].
inline std::vector<double> attention_reference_f64(const DenseKVView& kv,
                                                   const AttentionQueries& queries,
                                                   const AttentionParams& params) {
  EXPECT_EQ(kv.dtype, KVDType::kF32);
  const int d = kv.head_dim, group = params.n_heads / kv.kv_heads;
  const float* k = static_cast<const float*>(kv.k);
  const float* v = static_cast<const float*>(kv.v);
  std::vector<double> out(size_t(queries.n_q) * params.n_heads * d, 0.0);
  std::vector<double> scores(size_t(kv.n_tokens));
  for (int i = 0; i < queries.n_q; ++i) {
    const int64_t q_pos = queries.first_pos + i;
    for (int h = 0; h < params.n_heads; ++h) {
      const float* q = queries.q + (int64_t(i) * params.n_heads + h) * d;
      double* o = &out[(size_t(i) * params.n_heads + h) * d];
      const int64_t base = int64_t(h / group) * kv.head_stride;
      double max_score = -INFINITY;
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        if (!attention_visible(q_pos, kv.first_pos + t, params.sliding_window)) continue;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(q[c]) * k[(base + t) * d + c];
        double s = double(params.scale) * dot;
        if (params.logit_softcap > 0)
          s = params.logit_softcap * std::tanh(s / params.logit_softcap);
        scores[t] = s;
        max_score = std::max(max_score, s);
      }
      if (max_score == -INFINITY) continue;
      double sum = 0;
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        if (!attention_visible(q_pos, kv.first_pos + t, params.sliding_window)) continue;
        const double p = std::exp(scores[t] - max_score);
        sum += p;
        for (int c = 0; c < d; ++c) o[c] += p * v[(base + t) * d + c];
      }
      for (int c = 0; c < d; ++c) o[c] /= sum;
    }
  }
  return out;
}

// The largest ||got_row - expected_row||_2 / ||expected_row||_2 over the rows of head_dim
// elements (a zero expected row must be zero).
inline double max_row_relative_error(const std::vector<double>& expected,
                                     const std::vector<float>& got, int head_dim) {
  double worst = 0;
  for (size_t row = 0; row < expected.size() / head_dim; ++row) {
    double norm = 0, err = 0;
    for (int j = 0; j < head_dim; ++j) {
      const double e = expected[row * head_dim + j], g = got[row * head_dim + j];
      norm += e * e;
      err += (g - e) * (g - e);
    }
    worst = std::max(worst, norm > 0 ? std::sqrt(err / norm) : std::sqrt(err));
  }
  return worst;
}

// lse buffers [n_q, n_heads]: |got - expected| <= tol, and -inf exactly where expected is.
inline std::vector<float> lse_buffer(const AttentionCase& c) {
  return std::vector<float>(size_t(c.n_q) * c.n_heads(), kCanary);
}
inline void expect_lse_close(const AttentionCase& c, const std::vector<float>& expected,
                             const std::vector<float>& got, double tol,
                             const std::string& backend) {
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::isinf(expected[i])) {
      ASSERT_EQ(got[i], expected[i]) << backend << " lse row " << i << ", " << c.name();
      continue;
    }
    ASSERT_TRUE(std::isfinite(got[i])) << backend << " lse row " << i << ", " << c.name();
    worst = std::max(worst, double(std::abs(got[i] - expected[i])));
  }
  EXPECT_LE(worst, tol) << backend << " lse, " << c.name();
}

}  // namespace turbokv::testing
