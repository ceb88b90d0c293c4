// Gated DeltaNet steps against slow references: the recurrent (decode) and chunked (prefill)
// forms of the delta rule against the explicit transition-matrix recurrence in double, state
// carried across calls, and the causal convolution against its zero-padded definition.
#include "model/linear_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/mla.h"

namespace turbokv {
namespace {

struct Rng {
  explicit Rng(uint32_t seed) : gen(seed) {}
  double normal() { return std::normal_distribution<double>(0, 1)(gen); }
  double uniform() { return std::uniform_real_distribution<double>(0, 1)(gen); }
  std::mt19937 gen;
};

struct Problem {
  GatedDeltaShape shape{2, 4, 8, 6};
  int64_t T = 0;
  std::vector<float> q, k, v, g, beta;  // q, k: [T, Hk, dk] normalized; v: [T, Hv, dv]
  std::vector<float> state;             // [Hv, dk, dv]
  GatedDeltaInputs inputs(int64_t first, int64_t n) const {
    const int64_t qk = int64_t(shape.key_heads) * shape.k_dim;
    const int64_t vs = int64_t(shape.value_heads) * shape.v_dim;
    return GatedDeltaInputs{q.data() + first * qk,
                            k.data() + first * qk,
                            v.data() + first * vs,
                            qk,
                            vs,
                            g.data() + first * shape.value_heads,
                            beta.data() + first * shape.value_heads,
                            n};
  }
};

Problem make_problem(int64_t T, uint64_t seed) {
  Problem p;
  p.T = T;
  Rng rng{uint32_t(seed)};
  const GatedDeltaShape& s = p.shape;
  auto fill = [&](std::vector<float>& x, size_t n) {
    x.resize(n);
    for (float& e : x) e = float(rng.normal());
  };
  fill(p.q, size_t(T * s.key_heads * s.k_dim));
  fill(p.k, p.q.size());
  fill(p.v, size_t(T * s.value_heads * s.v_dim));
  fill(p.state, size_t(s.value_heads * s.k_dim * s.v_dim));
  for (std::vector<float>* x : {&p.q, &p.k}) {
    for (size_t row = 0; row < x->size(); row += size_t(s.k_dim)) {
      double n2 = 0;
      for (int i = 0; i < s.k_dim; ++i) n2 += double((*x)[row + size_t(i)]) * (*x)[row + size_t(i)];
      for (int i = 0; i < s.k_dim; ++i) (*x)[row + size_t(i)] /= float(std::sqrt(n2));
    }
  }
  p.g.resize(size_t(T * s.value_heads));
  p.beta.resize(p.g.size());
  for (size_t i = 0; i < p.g.size(); ++i) {
    p.g[i] = -float(0.01 + 0.5 * rng.uniform());
    p.beta[i] = float(rng.uniform());
  }
  return p;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
  }
}

TEST(GatedDelta, RecurrentAndChunkedFormsMatchTheReference) {
  for (const int64_t T : {1, 5, 37, 130}) {
    const Problem p = make_problem(T, 7 + uint64_t(T));
    const size_t out_n = size_t(T * p.shape.value_heads * p.shape.v_dim);
    std::vector<float> ref_state = p.state, ref_out(out_n);
    gated_delta_ref(p.inputs(0, T), p.shape, ref_state.data(), ref_out.data());

    std::vector<float> state = p.state, out(out_n);
    gated_delta_recurrent(p.inputs(0, T), p.shape, state.data(), out.data());
    expect_close(out, ref_out, 1e-4f, "recurrent output");
    expect_close(state, ref_state, 1e-4f, "recurrent state");

    for (const int chunk : {1, 16, 64}) {
      state = p.state;
      std::fill(out.begin(), out.end(), 0.0f);
      gated_delta_chunked(p.inputs(0, T), p.shape, chunk, state.data(), out.data());
      expect_close(out, ref_out, 1e-4f, "chunked output");
      expect_close(state, ref_state, 1e-4f, "chunked state");
    }
  }
}

TEST(GatedDelta, StateCarriesAcrossCalls) {
  const int64_t T = 41;
  const Problem p = make_problem(T, 99);
  const int64_t vs = int64_t(p.shape.value_heads) * p.shape.v_dim;
  std::vector<float> ref_state = p.state, ref_out(size_t(T * vs));
  gated_delta_ref(p.inputs(0, T), p.shape, ref_state.data(), ref_out.data());
  // A prefill of 23 tokens (chunked), then decode steps one token at a time.
  std::vector<float> state = p.state, out(size_t(T * vs));
  gated_delta_chunked(p.inputs(0, 23), p.shape, 8, state.data(), out.data());
  for (int64_t t = 23; t < T; ++t) {
    gated_delta_recurrent(p.inputs(t, 1), p.shape, state.data(), out.data() + t * vs);
  }
  expect_close(out, ref_out, 1e-4f, "output");
  expect_close(state, ref_state, 1e-4f, "state");
}

TEST(CausalConv, MatchesZeroPaddedDefinitionAndContinues) {
  const int C = 5, K = 4;
  const int64_t T = 11;
  Rng rng(3);
  std::vector<float> x(size_t(T * C)), w(size_t(C * K));
  for (float& e : x) e = float(rng.normal());
  for (float& e : w) e = float(rng.normal());
  // Definition: y[t, c] = silu(sum_j w[c, j] x[t - K + 1 + j, c]) with x = 0 before t = 0.
  std::vector<float> want(x.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int c = 0; c < C; ++c) {
      double acc = 0;
      for (int j = 0; j < K; ++j) {
        const int64_t u = t - K + 1 + j;
        if (u >= 0) acc += double(w[size_t(c * K + j)]) * x[size_t(u * C + c)];
      }
      want[size_t(t * C + c)] = float(acc / (1 + std::exp(-acc)));
    }
  }
  std::vector<float> history(size_t((K - 1) * C), 0.0f), got(x.size());
  causal_conv1d_silu(x.data(), 6, C, K, w.data(), history.data(), got.data());
  causal_conv1d_silu(x.data() + 6 * C, 1, C, K, w.data(), history.data(), got.data() + 6 * C);
  causal_conv1d_silu(x.data() + 7 * C, T - 7, C, K, w.data(), history.data(), got.data() + 7 * C);
  expect_close(got, want, 1e-5f, "conv");
  // The history holds the last K - 1 inputs.
  for (int r = 0; r < K - 1; ++r) {
    for (int c = 0; c < C; ++c) {
      EXPECT_EQ(history[size_t(r * C + c)], x[size_t((T - K + 1 + r) * C + c)]);
    }
  }
}

TEST(Mla, DeinterleaveTakesEvenThenOddDims) {
  std::vector<float> x = {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};
  deinterleave_pairs(x.data(), 2, 6);
  EXPECT_EQ(x, (std::vector<float>{0, 2, 4, 1, 3, 5, 10, 12, 14, 11, 13, 15}));
}

}  // namespace
}  // namespace turbokv
