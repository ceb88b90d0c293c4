// Gated DeltaNet steps (linear_attention.h): scalar code, fp32 like transformers' torch path
// (the reference accumulates in double).
#include "model/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kv/recurrent_state.h"
#include "model/decoder.h"

namespace turbokv {
namespace {

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Rows of one head across tokens.
struct HeadRows {
  const float* base;
  int64_t stride;
  const float* at(int64_t t) const { return base + t * stride; }
};

}  // namespace

void causal_conv1d_silu(const float* x, int64_t T, int C, int K, const float* weight,
                        float* history, float* out) {
  const int H = K - 1;                  // history rows
  auto input = [&](int64_t u, int c) {  // u: time, negative reads the history
    return u >= 0 ? x[u * C + c] : history[(H + u) * C + c];
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int c = 0; c < C; ++c) {
      const float* w = weight + int64_t(c) * K;
      float acc = 0;
      for (int j = 0; j < K; ++j) acc += w[j] * input(t - H + j, c);
      out[t * C + c] = silu(acc);
    }
  }
  // The newest H inputs become the history.
  std::vector<float> next(size_t(H) * size_t(C));
  for (int r = 0; r < H; ++r) {
    const int64_t u = T - H + r;
    for (int c = 0; c < C; ++c) next[size_t(r) * size_t(C) + size_t(c)] = input(u, c);
  }
  std::copy(next.begin(), next.end(), history);
}

void gated_delta_prepare(float* qkv, float* a, float* b, int64_t T, const GatedDeltaShape& s,
                         const float* a_log, const float* dt_bias) {
  const int64_t key_dim = int64_t(s.key_heads) * s.k_dim;
  const int64_t width = 2 * key_dim + int64_t(s.value_heads) * s.v_dim;
  const float q_scale = 1.0f / std::sqrt(float(s.k_dim));
  for (int64_t t = 0; t < T; ++t) {
    float* row = qkv + t * width;
    for (int part = 0; part < 2; ++part) {  // q, then k
      for (int h = 0; h < s.key_heads; ++h) {
        float* x = row + part * key_dim + int64_t(h) * s.k_dim;
        const float inv = 1.0f / std::sqrt(dot(x, x, s.k_dim) + 1e-6f);
        for (int i = 0; i < s.k_dim; ++i) x[i] *= inv;
        if (part == 0) {
          for (int i = 0; i < s.k_dim; ++i) x[i] *= q_scale;
        }
      }
    }
    for (int h = 0; h < s.value_heads; ++h) {
      float& g = a[t * s.value_heads + h];
      g = -std::exp(a_log[h]) * softplus(g + dt_bias[h]);
      float& beta = b[t * s.value_heads + h];
      beta = 1.0f / (1.0f + std::exp(-beta));
    }
  }
}

void gated_delta_recurrent(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state,
                           float* out) {
  const int dk = s.k_dim, dv = s.v_dim, group = s.value_heads / s.key_heads;
  std::vector<float> kv_mem(static_cast<size_t>(dv));
  for (int h = 0; h < s.value_heads; ++h) {
    float* S = state + int64_t(h) * dk * dv;  // [dk, dv]
    const int kh = h / group;
    for (int64_t t = 0; t < in.T; ++t) {
      const float* q = in.q + t * in.qk_stride + int64_t(kh) * dk;
      const float* k = in.k + t * in.qk_stride + int64_t(kh) * dk;
      const float* v = in.v + t * in.v_stride + int64_t(h) * dv;
      const float decay = std::exp(in.g[t * s.value_heads + h]);
      const float beta = in.beta[t * s.value_heads + h];
      std::fill(kv_mem.begin(), kv_mem.end(), 0.0f);
      for (int i = 0; i < dk; ++i) {
        float* Si = S + int64_t(i) * dv;
        for (int j = 0; j < dv; ++j) {
          Si[j] *= decay;
          kv_mem[size_t(j)] += Si[j] * k[i];
        }
      }
      for (int j = 0; j < dv; ++j) kv_mem[size_t(j)] = (v[j] - kv_mem[size_t(j)]) * beta;
      float* o = out + (t * s.value_heads + h) * dv;
      std::fill(o, o + dv, 0.0f);
      for (int i = 0; i < dk; ++i) {
        float* Si = S + int64_t(i) * dv;
        for (int j = 0; j < dv; ++j) {
          Si[j] += k[i] * kv_mem[size_t(j)];
          o[j] += Si[j] * q[i];
        }
      }
    }
  }
}

void gated_delta_chunked(const GatedDeltaInputs& in, const GatedDeltaShape& s, int chunk,
                         float* state, float* out) {
  const int dk = s.k_dim, dv = s.v_dim, group = s.value_heads / s.key_heads;
  const int C = std::max(1, chunk);
  std::vector<float> G(static_cast<size_t>(C));                             // cumulative log decay
  std::vector<float> L(size_t(C) * size_t(C));                              // strictly lower
  std::vector<float> U(size_t(C) * size_t(dv)), W(size_t(C) * size_t(dk));  // solved rows
  std::vector<float> vnew(size_t(C) * size_t(dv));
  for (int h = 0; h < s.value_heads; ++h) {
    float* S = state + int64_t(h) * dk * dv;
    const int kh = h / group;
    const HeadRows Q{in.q + int64_t(kh) * dk, in.qk_stride},
        K{in.k + int64_t(kh) * dk, in.qk_stride};
    const HeadRows V{in.v + int64_t(h) * dv, in.v_stride};
    auto g = [&](int64_t t) { return in.g[t * s.value_heads + h]; };
    auto beta = [&](int64_t t) { return in.beta[t * s.value_heads + h]; };
    for (int64_t t0 = 0; t0 < in.T; t0 += C) {
      const int n = int(std::min<int64_t>(C, in.T - t0));
      float acc = 0;
      for (int i = 0; i < n; ++i) G[size_t(i)] = acc += g(t0 + i);
      // L[i][j] = beta_i <k_i, k_j> exp(G_i - G_j), j < i; then (I + L) U = beta v and
      // (I + L) W = beta k exp(G) by forward substitution.
      for (int i = 0; i < n; ++i) {
        const float* ki = K.at(t0 + i);
        const float bi = beta(t0 + i);
        for (int j = 0; j < i; ++j) {
          L[size_t(i) * C + size_t(j)] =
              bi * dot(ki, K.at(t0 + j), dk) * std::exp(G[size_t(i)] - G[size_t(j)]);
        }
        float* u = U.data() + size_t(i) * dv;
        float* w = W.data() + size_t(i) * dk;
        const float* vi = V.at(t0 + i);
        const float eg = std::exp(G[size_t(i)]);
        for (int c = 0; c < dv; ++c) u[c] = vi[c] * bi;
        for (int c = 0; c < dk; ++c) w[c] = ki[c] * bi * eg;
        for (int j = 0; j < i; ++j) {
          const float l = L[size_t(i) * C + size_t(j)];
          const float* uj = U.data() + size_t(j) * dv;
          const float* wj = W.data() + size_t(j) * dk;
          for (int c = 0; c < dv; ++c) u[c] -= l * uj[c];
          for (int c = 0; c < dk; ++c) w[c] -= l * wj[c];
        }
      }
      // v_new = U - W·S: the part of the values the old state does not predict.
      for (int i = 0; i < n; ++i) {
        float* vn = vnew.data() + size_t(i) * dv;
        const float* u = U.data() + size_t(i) * dv;
        const float* w = W.data() + size_t(i) * dk;
        for (int c = 0; c < dv; ++c) vn[c] = u[c];
        for (int r = 0; r < dk; ++r) {
          const float* Sr = S + int64_t(r) * dv;
          for (int c = 0; c < dv; ++c) vn[c] -= w[r] * Sr[c];
        }
      }
      // o_i = exp(G_i) q_i·S + sum_{j <= i} <q_i, k_j> exp(G_i - G_j) v_new_j.
      for (int i = 0; i < n; ++i) {
        const float* qi = Q.at(t0 + i);
        float* o = out + ((t0 + i) * s.value_heads + h) * dv;
        const float eg = std::exp(G[size_t(i)]);
        std::fill(o, o + dv, 0.0f);
        for (int r = 0; r < dk; ++r) {
          const float* Sr = S + int64_t(r) * dv;
          const float qr = qi[r] * eg;
          for (int c = 0; c < dv; ++c) o[c] += qr * Sr[c];
        }
        for (int j = 0; j <= i; ++j) {
          const float a = dot(qi, K.at(t0 + j), dk) * std::exp(G[size_t(i)] - G[size_t(j)]);
          const float* vn = vnew.data() + size_t(j) * dv;
          for (int c = 0; c < dv; ++c) o[c] += a * vn[c];
        }
      }
      // S = exp(G_last) S + sum_j exp(G_last - G_j) k_j v_new_jᵀ.
      const float glast = G[size_t(n - 1)];
      const float decay = std::exp(glast);
      for (int r = 0; r < dk; ++r) {
        float* Sr = S + int64_t(r) * dv;
        for (int c = 0; c < dv; ++c) Sr[c] *= decay;
      }
      for (int j = 0; j < n; ++j) {
        const float* kj = K.at(t0 + j);
        const float e = std::exp(glast - G[size_t(j)]);
        const float* vn = vnew.data() + size_t(j) * dv;
        for (int r = 0; r < dk; ++r) {
          float* Sr = S + int64_t(r) * dv;
          const float kr = kj[r] * e;
          for (int c = 0; c < dv; ++c) Sr[c] += kr * vn[c];
        }
      }
    }
  }
}

void gated_delta_ref(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state,
                     float* out) {
  const int dk = s.k_dim, dv = s.v_dim, group = s.value_heads / s.key_heads;
  std::vector<double> S(size_t(dk) * size_t(dv)), next(S.size()), A(size_t(dk) * size_t(dk));
  for (int h = 0; h < s.value_heads; ++h) {
    float* Sh = state + int64_t(h) * dk * dv;
    std::copy(Sh, Sh + int64_t(dk) * dv, S.begin());
    const int kh = h / group;
    for (int64_t t = 0; t < in.T; ++t) {
      const float* q = in.q + t * in.qk_stride + int64_t(kh) * dk;
      const float* k = in.k + t * in.qk_stride + int64_t(kh) * dk;
      const float* v = in.v + t * in.v_stride + int64_t(h) * dv;
      const double decay = std::exp(double(in.g[t * s.value_heads + h]));
      const double beta = in.beta[t * s.value_heads + h];
      // A = exp(g) (I - beta k kᵀ); S = A S + beta k vᵀ.
      for (int r = 0; r < dk; ++r) {
        for (int c = 0; c < dk; ++c) {
          A[size_t(r) * dk + size_t(c)] = decay * ((r == c ? 1.0 : 0.0) - beta * k[r] * k[c]);
        }
      }
      for (int r = 0; r < dk; ++r) {
        for (int c = 0; c < dv; ++c) {
          double acc = beta * k[r] * v[c];
          for (int m = 0; m < dk; ++m) acc += A[size_t(r) * dk + size_t(m)] * S[size_t(m) * dv + c];
          next[size_t(r) * dv + size_t(c)] = acc;
        }
      }
      S.swap(next);
      float* o = out + (t * s.value_heads + h) * dv;
      for (int c = 0; c < dv; ++c) {
        double acc = 0;
        for (int r = 0; r < dk; ++r) acc += S[size_t(r) * dv + size_t(c)] * q[r];
        o[c] = float(acc);
      }
    }
    for (size_t i = 0; i < S.size(); ++i) Sh[i] = float(S[i]);
  }
}

void gated_rms_norm(float* x, const float* z, int64_t rows, int d, const float* w, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * d;
    const float* zr = z + r * d;
    const float inv = 1.0f / std::sqrt(dot(xr, xr, d) / float(d) + eps);
    for (int i = 0; i < d; ++i) xr[i] = w[i] * (xr[i] * inv) * silu(zr[i]);
  }
}

void linear_attention_block(const LinearAttentionWeights& w, const ModelConfig& c,
                            const std::vector<SequenceRows>& rows, const float* xn, int64_t T,
                            float* out) {
  const LinearAttentionConfig& la = c.linear;
  const GatedDeltaShape shape{la.num_key_heads, la.num_value_heads, la.key_head_dim,
                              la.value_head_dim};
  const int64_t C = la.conv_channels(), Hv = la.num_value_heads;
  const int64_t key_dim = int64_t(la.num_key_heads) * la.key_head_dim;
  const int64_t v_dim = Hv * la.value_head_dim;
  std::vector<float> mixed(size_t(T * C)), conv(size_t(T * C));      // [T, C]: [q | k | v]
  std::vector<float> z(size_t(T * v_dim)), core(size_t(T * v_dim));  // [T, Hv, dv]
  std::vector<float> b(size_t(T * Hv)), a(size_t(T * Hv));           // [T, Hv]
  const MatmulJob jobs[] = {{xn, w.qkv, nullptr, mixed.data()},
                            {xn, w.z, nullptr, z.data()},
                            {xn, w.b, nullptr, b.data()},
                            {xn, w.a, nullptr, a.data()}};
  matmul_many(T, jobs);
  std::vector<RecurrentState*> states;
  for (const SequenceRows& r : rows) {
    auto* state = dynamic_cast<RecurrentState*>(r.cache);
    if (state == nullptr || state->shape().conv_channels != C || state->shape().heads != Hv) {
      throw InvalidArgument(str_cat("a linear-attention layer needs its RecurrentState of ", Hv,
                                    " heads, got a ", r.cache->type_name(), " cache"));
    }
    causal_conv1d_silu(mixed.data() + r.row * C, r.count, int(C), la.conv_kernel, w.conv.data(),
                       state->conv(), conv.data() + r.row * C);
    states.push_back(state);
  }
  gated_delta_prepare(conv.data(), a.data(), b.data(), T, shape, w.a_log.data(), w.dt_bias.data());
  constexpr int kChunk = 64;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SequenceRows& r = rows[i];
    const float* base = conv.data() + r.row * C;
    const GatedDeltaInputs in{base, base + key_dim,        base + 2 * key_dim,    C,
                              C,    a.data() + r.row * Hv, b.data() + r.row * Hv, r.count};
    float* o = core.data() + r.row * v_dim;
    if (r.count == 1) {
      gated_delta_recurrent(in, shape, states[i]->state(), o);
    } else {
      gated_delta_chunked(in, shape, kChunk, states[i]->state(), o);
    }
    states[i]->advance(r.count);
  }
  gated_rms_norm(core.data(), z.data(), T * Hv, la.value_head_dim, w.norm.data(),
                 float(c.rms_norm_eps));
  matmul(core.data(), T, w.out, nullptr, out);
}

}  // namespace turbokv
