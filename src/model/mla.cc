// Multi-head latent attention (mla.h): weight binding with kv_b_proj split per head, and the
// layer's forward pass on a latent cache.
#include "model/mla.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "model/decoder.h"
#include "model/rope_scaling.h"

namespace turbokv {

void deinterleave_pairs(float* x, int64_t rows, int d) {
  std::vector<float> tmp(static_cast<size_t>(d));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * d;
    for (int i = 0; i < d / 2; ++i) {
      tmp[size_t(i)] = row[2 * i];
      tmp[size_t(d / 2 + i)] = row[2 * i + 1];
    }
    std::copy(tmp.begin(), tmp.end(), row);
  }
}

MlaWeights load_mla_weights(const WeightStore& store, const std::string& a, const ModelConfig& c) {
  const MlaConfig& m = c.mla;
  const int64_t H = c.hidden_size, heads = c.num_heads;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim, r = m.kv_lora_rank;
  const int64_t per_head = m.qk_nope_head_dim + m.v_head_dim;
  MlaWeights w;
  if (m.q_lora_rank > 0) {
    w.q_a = store.matrix(a + "q_a_proj.weight", m.q_lora_rank, H);
    w.q_a_norm = store.vector(a + "q_a_layernorm.weight", m.q_lora_rank);
    w.q_b = store.matrix(a + "q_b_proj.weight", heads * qk, m.q_lora_rank);
  } else {
    w.q = store.matrix(a + "q_proj.weight", heads * qk, H);
  }
  w.kv_a = store.matrix(a + "kv_a_proj_with_mqa.weight", r + m.qk_rope_head_dim, H);
  w.kv_a_norm = store.vector(a + "kv_a_layernorm.weight", r);
  const WeightMatrix kv_b = store.matrix(a + "kv_b_proj.weight", heads * per_head, r);
  w.absorb_storage.resize(size_t(heads));
  for (int64_t h = 0; h < heads; ++h) {
    // W_uk,h: [nope, r] rows of kv_b_proj; the query absorption multiplies by it, so keep its
    // transpose [r, nope] for matmul (y = x·wᵀ).
    std::vector<float> uk(size_t(m.qk_nope_head_dim * r));
    widen_rows(kv_b, h * per_head, m.qk_nope_head_dim, uk.data());
    std::vector<float>& t = w.absorb_storage[size_t(h)];
    t.resize(uk.size());
    for (int64_t i = 0; i < m.qk_nope_head_dim; ++i) {
      for (int64_t j = 0; j < r; ++j) t[size_t(j * m.qk_nope_head_dim + i)] = uk[size_t(i * r + j)];
    }
    w.absorb.push_back(WeightMatrix{DType::F32, reinterpret_cast<const uint8_t*>(t.data()), r,
                                    m.qk_nope_head_dim});
    w.expand.push_back(kv_b.row_slice(h * per_head + m.qk_nope_head_dim, m.v_head_dim));
  }
  w.o = store.matrix(a + "o_proj.weight", H, heads * m.v_head_dim);
  return w;
}

void mla_block(const MlaWeights& w, const ModelConfig& c, const std::vector<SequenceRows>& rows,
               const float* xn, const int64_t* positions, int64_t T, float* out) {
  const MlaConfig& m = c.mla;
  const int64_t heads = c.num_heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
  const int64_t qk = nope + rope, r = m.kv_lora_rank, L = m.latent_dim(), vd = m.v_head_dim;
  const float eps = float(c.rms_norm_eps);
  std::vector<float> q(size_t(T * heads * qk));  // [T, heads, nope | rope]
  if (m.q_lora_rank > 0) {
    std::vector<float> qa(size_t(T * m.q_lora_rank));  // [T, q_lora_rank]
    matmul(xn, T, w.q_a, nullptr, qa.data());
    rms_norm(qa.data(), T, m.q_lora_rank, w.q_a_norm.data(), eps, qa.data());
    matmul(qa.data(), T, w.q_b, nullptr, q.data());
  } else {
    matmul(xn, T, w.q, nullptr, q.data());
  }
  std::vector<float> latent(size_t(T * L));  // [T, r | rope]: the cached rows
  matmul(xn, T, w.kv_a, nullptr, latent.data());
  std::vector<float> q_rope(size_t(T * heads * rope)), k_rope(size_t(T * rope));
  for (int64_t t = 0; t < T; ++t) {
    float* row = latent.data() + t * L;
    rms_norm(row, 1, r, w.kv_a_norm.data(), eps, row);
    std::copy_n(row + r, rope, k_rope.data() + t * rope);
    for (int64_t h = 0; h < heads; ++h) {
      std::copy_n(q.data() + (t * heads + h) * qk + nope, rope,
                  q_rope.data() + (t * heads + h) * rope);
    }
  }
  if (m.rope_interleave) {
    deinterleave_pairs(q_rope.data(), T * heads, int(rope));
    deinterleave_pairs(k_rope.data(), T, int(rope));
  }
  const int64_t seq_len = *std::max_element(positions, positions + T) + 1;
  const RopeTable table = make_rope_table(c.rope, int(rope), seq_len);
  apply_rope(q_rope.data(), T, int(heads), int(rope), positions, table);
  apply_rope(k_rope.data(), T, 1, int(rope), positions, table);
  for (int64_t t = 0; t < T; ++t)
    std::copy_n(k_rope.data() + t * rope, rope, latent.data() + t * L + r);

  // Latent queries: per head [W_uk,hᵀ q_nope,h | q_rope,h].
  std::vector<float> ql(size_t(T * heads * L));  // [T, heads, L]
  std::vector<float> part(size_t(T * std::max(nope, r))), lat(size_t(T * std::max(r, vd)));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(q.data() + (t * heads + h) * qk, nope, part.data() + t * nope);
    }
    matmul(part.data(), T, w.absorb[size_t(h)], nullptr, lat.data());  // [T, r]
    for (int64_t t = 0; t < T; ++t) {
      float* dst = ql.data() + (t * heads + h) * L;
      std::copy_n(lat.data() + t * r, r, dst);
      std::copy_n(q_rope.data() + (t * heads + h) * rope, rope, dst + r);
    }
  }
  AttentionParams params;
  params.n_heads = int(heads);
  params.scale = c.attention_scale;
  std::vector<float> att(size_t(T * heads * L));  // [T, heads, L]
  for (const SequenceRows& s : rows) {
    s.cache->append(latent.data() + s.row * L, latent.data() + s.row * L, s.count);
    s.cache->attend(ql.data() + s.row * heads * L, s.count, params, att.data() + s.row * heads * L);
  }
  // Per head: the latent part of the output, expanded by W_uv,h.
  std::vector<float> ov(size_t(T * heads * vd));  // [T, heads, v]
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(att.data() + (t * heads + h) * L, r, part.data() + t * r);
    }
    matmul(part.data(), T, w.expand[size_t(h)], nullptr, lat.data());  // [T, v]
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(lat.data() + t * vd, vd, ov.data() + (t * heads + h) * vd);
    }
  }
  matmul(ov.data(), T, w.o, nullptr, out);
}

}  // namespace turbokv
