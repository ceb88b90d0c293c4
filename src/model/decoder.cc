// DecoderModel (decoder.h): weight binding from the family flags, and the batched forward pass.
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "model/rope_scaling.h"

namespace turbokv {
namespace {

// Rows of logits computed per lm_head matmul (bounds the scratch for large vocabularies).
constexpr int64_t kLogitRowsPerBatch = 64;

const float* data_or_null(const std::vector<float>& v) {
  return v.empty() ? nullptr : v.data();
}

void add_in_place(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// The embedding scale in the weights' dtype, as transformers multiplies it.
float round_to_dtype(float v, DType dtype) {
  if (dtype == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

}  // namespace

void mlp_forward(const MlpWeights& w, Activation act, const float* x, int64_t n, float* out) {
  std::vector<float> gate(size_t(n * w.gate.rows)), up(size_t(n * w.up.rows));  // [n, I]
  const MatmulJob gate_up[] = {{x, w.gate, data_or_null(w.gate_bias), gate.data()},
                               {x, w.up, data_or_null(w.up_bias), up.data()}};
  matmul_many(n, gate_up);
  gated_activation(gate.data(), up.data(), int64_t(gate.size()), act, gate.data());
  matmul(gate.data(), n, w.down, data_or_null(w.down_bias), out);
}

std::vector<float> DecoderModel::norm_weight(const std::string& name, int64_t n) const {
  std::vector<float> w = weights_.vector(name, n);
  if (config_.norm_plus_one) {
    for (float& v : w) v += 1.0f;
  }
  return w;
}

DecoderModel::DecoderModel(ModelConfig config, WeightStore weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  const std::string& root = c.weight_prefix;

  embed_ = weights_.matrix(root + "embed_tokens.weight", c.vocab_size, H);
  embedding_scale_ = round_to_dtype(c.embedding_scale, embed_.dtype);
  lm_head_ = c.tie_word_embeddings ? embed_ : weights_.matrix("lm_head.weight", c.vocab_size, H);
  final_norm_ = norm_weight(root + "norm.weight", H);
  if (c.per_layer_input_dim > 0) {
    const int64_t P = c.per_layer_input_dim, LP = int64_t(c.num_layers) * P;
    per_layer_embed_ =
        weights_.matrix(root + "embed_tokens_per_layer.weight", c.per_layer_vocab, LP);
    per_layer_model_projection_ =
        weights_.matrix(root + "per_layer_model_projection.weight", LP, H);
    per_layer_projection_norm_ = norm_weight(root + "per_layer_projection_norm.weight", P);
  }

  auto bias = [&](bool present, const std::string& name, int64_t n) {
    return present ? weights_.vector(name, n) : std::vector<float>();
  };
  auto mlp_weights = [&](const std::string& p, int64_t inter) {
    MlpWeights m;
    if (c.fused_gate_up) {
      const WeightMatrix gate_up = weights_.matrix(p + "gate_up_proj.weight", 2 * inter, H);
      m.gate = gate_up.row_slice(0, inter);
      m.up = gate_up.row_slice(inter, inter);
    } else {
      m.gate = weights_.matrix(p + "gate_proj.weight", inter, H);
      m.up = weights_.matrix(p + "up_proj.weight", inter, H);
      m.gate_bias = bias(c.mlp_bias, p + "gate_proj.bias", inter);
      m.up_bias = bias(c.mlp_bias, p + "up_proj.bias", inter);
    }
    m.down = weights_.matrix(p + "down_proj.weight", H, inter);
    m.down_bias = bias(c.mlp_bias, p + "down_proj.bias", H);
    return m;
  };

  layers_.resize(size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = layers_[size_t(l)];
    const std::string p = str_cat(root, "layers.", l, ".");
    const std::string a = p + "self_attn.";
    L.input_norm = norm_weight(p + "input_layernorm.weight", H);
    L.post_attention_norm = norm_weight(p + "post_attention_layernorm.weight", H);
    if (c.sandwich_norms) {
      L.pre_feedforward_norm = norm_weight(p + "pre_feedforward_layernorm.weight", H);
      L.post_feedforward_norm = norm_weight(p + "post_feedforward_layernorm.weight", H);
    }
    switch (c.layer_kind[size_t(l)]) {
      case LayerKind::kLinearAttention: {
        const LinearAttentionConfig& la = c.linear;
        const std::string q = p + "linear_attn.";
        const int64_t C = la.conv_channels(), Hv = la.num_value_heads;
        const int64_t vdim = Hv * la.value_head_dim;
        LinearAttentionWeights& w = L.linear;
        w.qkv = weights_.matrix(q + "in_proj_qkv.weight", C, H);
        w.z = weights_.matrix(q + "in_proj_z.weight", vdim, H);
        w.b = weights_.matrix(q + "in_proj_b.weight", Hv, H);
        w.a = weights_.matrix(q + "in_proj_a.weight", Hv, H);
        w.out = weights_.matrix(q + "out_proj.weight", H, vdim);
        w.conv = weights_.floats(q + "conv1d.weight", {C, 1, la.conv_kernel});
        w.a_log = weights_.vector(q + "A_log", Hv);
        w.dt_bias = weights_.vector(q + "dt_bias", Hv);
        w.norm = weights_.vector(q + "norm.weight", la.value_head_dim);
        break;
      }
      case LayerKind::kMla:
        L.mla = load_mla_weights(weights_, a, c);
        break;
      case LayerKind::kAttention: {
        const AttentionLayerConfig& at = c.attention[size_t(l)];
        const int64_t hd = at.head_dim;
        const int64_t q_dim = int64_t(at.num_heads) * hd, kv_dim = int64_t(at.num_kv_heads) * hd;
        const int64_t q_rows = c.attention_output_gate ? 2 * q_dim : q_dim;
        const bool own_kv = at.kv_source < 0;
        if (c.qk_norm) {
          L.q_norm = norm_weight(a + "q_norm.weight", hd);
          if (own_kv) L.k_norm = norm_weight(a + "k_norm.weight", hd);
        }
        if (c.fused_qkv) {
          const WeightMatrix qkv = weights_.matrix(a + "qkv_proj.weight", q_dim + 2 * kv_dim, H);
          L.q = qkv.row_slice(0, q_dim);
          L.k = qkv.row_slice(q_dim, kv_dim);
          L.v = qkv.row_slice(q_dim + kv_dim, kv_dim);
        } else {
          L.q = weights_.matrix(a + "q_proj.weight", q_rows, H);
          L.q_bias = bias(c.qkv_bias, a + "q_proj.bias", q_rows);
          if (own_kv) {
            L.k = weights_.matrix(a + "k_proj.weight", kv_dim, H);
            L.k_bias = bias(c.qkv_bias, a + "k_proj.bias", kv_dim);
            if (!at.values_from_keys) {
              L.v = weights_.matrix(a + "v_proj.weight", kv_dim, H);
              L.v_bias = bias(c.qkv_bias, a + "v_proj.bias", kv_dim);
            }
          }
        }
        L.o = weights_.matrix(a + "o_proj.weight", H, q_dim);
        L.o_bias = bias(c.o_bias, a + "o_proj.bias", H);
        break;
      }
    }
    if (c.per_layer_input_dim > 0) {
      const int64_t P = c.per_layer_input_dim;
      L.per_layer_gate = weights_.matrix(p + "per_layer_input_gate.weight", P, H);
      L.per_layer_projection = weights_.matrix(p + "per_layer_projection.weight", H, P);
      L.per_layer_norm = norm_weight(p + "post_per_layer_input_norm.weight", H);
    }
    if (c.layer_scalar) L.layer_scalar = weights_.vector(p + "layer_scalar", 1)[0];
    if (!c.moe_layer.empty() && c.moe_layer[size_t(l)]) {
      MoeWeights moe;
      moe.router = weights_.matrix(p + "mlp.gate.weight", c.num_experts, H);
      const int64_t I = c.moe_intermediate_size;
      if (weights_.has(p + "mlp.experts.gate_up_proj")) {
        // Fused experts (transformers 5): gate_up_proj [E, 2I, H] (gate rows, then up rows),
        // down_proj [E, H, I].
        for (int e = 0; e < c.num_experts; ++e) {
          MlpWeights m;
          const WeightMatrix gate_up = weights_.stacked_matrix(p + "mlp.experts.gate_up_proj",
                                                               c.num_experts, e, 2 * I, H);
          m.gate = gate_up.row_slice(0, I);
          m.up = gate_up.row_slice(I, I);
          m.down = weights_.stacked_matrix(p + "mlp.experts.down_proj", c.num_experts, e, H, I);
          moe.experts.push_back(std::move(m));
        }
      } else {
        for (int e = 0; e < c.num_experts; ++e) {
          moe.experts.push_back(mlp_weights(str_cat(p, "mlp.experts.", e, "."), I));
        }
      }
      moe.top_k = c.num_experts_per_token;
      moe.norm_topk_prob = c.norm_topk_prob;
      moe.routing = c.moe_routing;
      moe.groups = c.moe_groups;
      moe.topk_groups = c.moe_topk_groups;
      moe.routed_scale = c.routed_scaling_factor;
      if (c.moe_routing == MoeRouting::kSigmoidGroupedTopK) {
        moe.score_bias = weights_.vector(p + "mlp.gate.e_score_correction_bias", c.num_experts);
      }
      if (c.shared_expert_intermediate > 0) {
        moe.shared_expert =
            mlp_weights(str_cat(p, "mlp.", c.shared_expert_name, "."), c.shared_expert_intermediate);
        if (c.shared_expert_gate) {
          moe.shared_gate = weights_.matrix(p + "mlp.shared_expert_gate.weight", 1, H);
        }
      }
      L.moe = std::move(moe);
    } else {
      const int inter = c.intermediate_per_layer.empty() ? c.intermediate_size
                                                         : c.intermediate_per_layer[size_t(l)];
      L.mlp = mlp_weights(p + "mlp.", inter);
    }
  }
}

std::vector<LayerSpec> DecoderModel::layer_specs() const {
  return layer_specs_for(config_);
}

std::vector<LayerSpec> layer_specs_for(const ModelConfig& c) {
  std::vector<LayerSpec> specs;
  for (int l = 0; l < c.num_layers; ++l) {
    LayerSpec spec;
    switch (c.layer_kind[size_t(l)]) {
      case LayerKind::kLinearAttention: {
        const LinearAttentionConfig& la = c.linear;
        spec.kind = LayerStateKind::kRecurrent;
        spec.recurrent = RecurrentShape{la.conv_channels(), la.conv_kernel - 1, la.num_value_heads,
                                        la.key_head_dim, la.value_head_dim};
        break;
      }
      case LayerKind::kMla:
        spec.kind = LayerStateKind::kLatent;
        spec.kv_heads = 1;
        spec.head_dim = c.mla.latent_dim();
        break;
      case LayerKind::kAttention: {
        const AttentionLayerConfig& a = c.attention[size_t(l)];
        spec.kv_heads = a.num_kv_heads;
        spec.head_dim = a.head_dim;
        spec.sliding_window = a.sliding_window;
        spec.logit_softcap = c.attn_logit_softcap;
        if (a.kv_source >= 0) {
          spec.kind = LayerStateKind::kShared;
          spec.shared_with = a.kv_source;
        }
        break;
      }
    }
    specs.push_back(spec);
  }
  return specs;
}

void DecoderModel::forward(std::span<const Chunk> chunks) const {
  check_chunks(chunks, config_.num_layers, config_.vocab_size);
  for (const std::vector<ChunkSlice>& step : split_into_steps(chunks, kForwardStepTokens)) {
    run_step(step);
  }
}

void DecoderModel::run_step(const std::vector<ChunkSlice>& slices) const {
  int64_t T = 0;
  for (const ChunkSlice& s : slices) T += s.count;
  const int64_t H = config_.hidden_size;
  std::vector<int32_t> tokens(static_cast<size_t>(T));     // [T]
  std::vector<int64_t> positions(static_cast<size_t>(T));  // [T]
  int64_t t = 0;
  for (const ChunkSlice& s : slices) {
    const int64_t first = (*s.chunk->caches)[0]->size();
    for (int i = 0; i < s.count; ++i, ++t) {
      tokens[size_t(t)] = s.chunk->tokens[s.begin + i];
      positions[size_t(t)] = first + i;
    }
  }
  std::vector<float> x(size_t(T * H));  // [T, H] residual stream
  gather_rows(embed_, tokens.data(), T, embedding_scale_, x.data());
  const std::vector<float> per_layer = per_layer_inputs(tokens.data(), x.data(), T);
  const int64_t P = config_.per_layer_input_dim;
  for (int l = 0; l < config_.num_layers; ++l) {
    const LayerWeights& L = layers_[size_t(l)];
    attention_block(L, l, slices, positions.data(), T, x.data());
    feed_forward_block(L, T, x.data());
    if (P > 0) per_layer_input_block(L, per_layer.data() + l * P, T, x.data());
    if (config_.layer_scalar) {
      for (float& v : x) v *= L.layer_scalar;
    }
  }
  write_logits(slices, x.data());
}

std::vector<float> DecoderModel::per_layer_inputs(const int32_t* tokens, const float* x,
                                                  int64_t T) const {
  const ModelConfig& c = config_;
  const int64_t P = c.per_layer_input_dim, LP = int64_t(c.num_layers) * P;
  if (P == 0) return {};
  // (rmsnorm(x·Wᵀ / sqrt(H)) per layer + embed_per_layer(token) * sqrt(P)) / sqrt(2).
  std::vector<float> proj(size_t(T * LP)), tok(size_t(T * LP));  // [T, layers, P]
  matmul(x, T, per_layer_model_projection_, nullptr, proj.data());
  const float proj_scale = round_to_dtype(float(1.0 / std::sqrt(double(c.hidden_size))),
                                          per_layer_model_projection_.dtype);
  for (float& v : proj) v *= proj_scale;
  rms_norm(proj.data(), T * c.num_layers, P, per_layer_projection_norm_.data(),
           float(c.rms_norm_eps), proj.data());
  std::vector<int32_t> ids(tokens, tokens + T);
  for (int32_t& id : ids) {
    if (id >= c.per_layer_vocab) id = 0;  // only the text vocabulary has per-layer embeddings
  }
  gather_rows(per_layer_embed_, ids.data(), T,
              round_to_dtype(float(std::sqrt(double(P))), per_layer_embed_.dtype), tok.data());
  const float mix = float(1.0 / std::sqrt(2.0));
  for (size_t i = 0; i < proj.size(); ++i) proj[i] = (proj[i] + tok[i]) * mix;
  return proj;
}

void DecoderModel::per_layer_input_block(const LayerWeights& L, const float* input, int64_t T,
                                         float* x) const {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, P = c.per_layer_input_dim, stride = c.num_layers * P;
  std::vector<float> gate(size_t(T * P)), branch(size_t(T * H));  // [T, P], [T, H]
  matmul(x, T, L.per_layer_gate, nullptr, gate.data());
  for (int64_t t = 0; t < T; ++t) {
    // act(gate) * input: gated_activation computes act(gate) * up.
    gated_activation(gate.data() + t * P, input + t * stride, P, c.activation, gate.data() + t * P);
  }
  matmul(gate.data(), T, L.per_layer_projection, nullptr, branch.data());
  rms_norm(branch.data(), T, H, L.per_layer_norm.data(), float(c.rms_norm_eps), branch.data());
  add_in_place(x, branch.data(), T * H);
}

void DecoderModel::attention_block(const LayerWeights& L, int index,
                                   const std::vector<ChunkSlice>& slices, const int64_t* positions,
                                   int64_t T, float* x) const {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  std::vector<float> xn(size_t(T * H));  // [T, H]
  rms_norm(x, T, H, L.input_norm.data(), eps, xn.data());
  std::vector<SequenceRows> rows;
  int64_t offset = 0;
  for (const ChunkSlice& s : slices) {
    rows.push_back(SequenceRows{(*s.chunk->caches)[size_t(index)].get(), offset, s.count});
    offset += s.count;
  }
  std::vector<float> out(size_t(T * H));  // [T, H]
  const LayerKind kind = c.layer_kind[size_t(index)];
  if (kind == LayerKind::kLinearAttention) {
    linear_attention_block(L.linear, c, rows, xn.data(), T, out.data());
  } else if (kind == LayerKind::kMla) {
    mla_block(*L.mla, c, rows, xn.data(), positions, T, out.data());
  } else {
    const AttentionLayerConfig& at = c.attention[size_t(index)];
    const int64_t hd = at.head_dim;
    const int64_t q_dim = int64_t(at.num_heads) * hd, kv_dim = int64_t(at.num_kv_heads) * hd;
    const bool own_kv = at.kv_source < 0;
    std::vector<float> q(size_t(T * q_dim)), attn(size_t(T * q_dim));  // [T, heads, hd]
    std::vector<float> k, v, gate;                                     // [T, kv_heads, hd]
    std::vector<float> qg;  // [T, heads, 2 hd]: query and output gate per head
    if (c.attention_output_gate) qg.resize(size_t(T * 2 * q_dim));
    std::vector<MatmulJob> jobs = {
        {xn.data(), L.q, data_or_null(L.q_bias), c.attention_output_gate ? qg.data() : q.data()}};
    if (own_kv) {
      k.resize(size_t(T * kv_dim));
      v.resize(size_t(T * kv_dim));
      jobs.push_back({xn.data(), L.k, data_or_null(L.k_bias), k.data()});
      if (!at.values_from_keys) jobs.push_back({xn.data(), L.v, data_or_null(L.v_bias), v.data()});
    }
    matmul_many(T, jobs);
    if (c.attention_output_gate) {
      gate.resize(size_t(T * q_dim));
      for (int64_t r = 0; r < T * at.num_heads; ++r) {
        std::copy_n(qg.data() + r * 2 * hd, hd, q.data() + r * hd);
        std::copy_n(qg.data() + r * 2 * hd + hd, hd, gate.data() + r * hd);
      }
    }
    if (own_kv && at.values_from_keys) v = k;  // V from the raw keys, before k_norm and RoPE
    if (c.qk_norm) {
      rms_norm(q.data(), T * at.num_heads, hd, L.q_norm.data(), eps, q.data());
      if (own_kv) rms_norm(k.data(), T * at.num_kv_heads, hd, L.k_norm.data(), eps, k.data());
    }
    if (own_kv && c.v_norm) {
      const std::vector<float> ones(size_t(hd), 1.0f);
      rms_norm(v.data(), T * at.num_kv_heads, hd, ones.data(), eps, v.data());
    }
    const int window = at.sliding_window;
    const RopeConfig& rope = window > 0 && c.rope_local ? *c.rope_local : c.rope;
    const int64_t seq_len = *std::max_element(positions, positions + T) + 1;
    const RopeTable table = make_rope_table(rope, int(hd), seq_len);
    apply_rope(q.data(), T, at.num_heads, int(hd), positions, table);
    if (own_kv) apply_rope(k.data(), T, at.num_kv_heads, int(hd), positions, table);

    AttentionParams params;
    params.n_heads = at.num_heads;
    params.scale = c.attention_scale;
    params.logit_softcap = c.attn_logit_softcap;
    params.sliding_window = window;
    for (const SequenceRows& r : rows) {
      // A KV-shared layer's cache is a view of its owner's, which already holds these tokens.
      if (own_kv) r.cache->append(k.data() + r.row * kv_dim, v.data() + r.row * kv_dim, r.count);
      r.cache->attend(q.data() + r.row * q_dim, r.count, params, attn.data() + r.row * q_dim);
    }
    if (c.attention_output_gate) {
      for (size_t i = 0; i < attn.size(); ++i) attn[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
    }
    matmul(attn.data(), T, L.o, data_or_null(L.o_bias), out.data());
  }
  if (c.sandwich_norms) {
    rms_norm(out.data(), T, H, L.post_attention_norm.data(), eps, out.data());
  }
  add_in_place(x, out.data(), T * H);
}

void DecoderModel::feed_forward_block(const LayerWeights& L, int64_t T, float* x) const {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  std::vector<float> xn(size_t(T * H)), out(size_t(T * H));  // [T, H]
  rms_norm(x, T, H, (c.sandwich_norms ? L.pre_feedforward_norm : L.post_attention_norm).data(), eps,
           xn.data());
  if (L.moe) {
    moe_forward(*L.moe, c.activation, xn.data(), T, H, out.data());
  } else {
    mlp_forward(L.mlp, c.activation, xn.data(), T, out.data());
  }
  if (c.sandwich_norms) rms_norm(out.data(), T, H, L.post_feedforward_norm.data(), eps, out.data());
  add_in_place(x, out.data(), T * H);
}

void DecoderModel::write_logits(const std::vector<ChunkSlice>& slices, const float* x) const {
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  // Rows of x that need logits and where each goes.
  std::vector<int64_t> rows;
  std::vector<float*> destinations;
  int64_t offset = 0;
  for (const ChunkSlice& s : slices) {
    const Chunk& chunk = *s.chunk;
    if (chunk.logits != nullptr && chunk.all_logits) {
      for (int i = 0; i < s.count; ++i) {
        rows.push_back(offset + i);
        destinations.push_back(chunk.logits + int64_t(s.begin + i) * V);
      }
    } else if (chunk.logits != nullptr && s.begin + s.count == chunk.n_tokens) {
      rows.push_back(offset + s.count - 1);
      destinations.push_back(chunk.logits);
    }
    offset += s.count;
  }
  for (size_t b = 0; b < rows.size(); b += size_t(kLogitRowsPerBatch)) {
    const int64_t n = std::min<int64_t>(kLogitRowsPerBatch, int64_t(rows.size() - b));
    std::vector<float> xs(size_t(n * H));      // [n, H]
    std::vector<float> logits(size_t(n * V));  // [n, V]
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(xs.data() + i * H, x + rows[b + size_t(i)] * H, size_t(H) * sizeof(float));
    }
    rms_norm(xs.data(), n, H, final_norm_.data(), float(config_.rms_norm_eps), xs.data());
    matmul(xs.data(), n, lm_head_, nullptr, logits.data());
    if (config_.final_logit_softcap > 0) softcap(logits.data(), n * V, config_.final_logit_softcap);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(destinations[b + size_t(i)], logits.data() + i * V, size_t(V) * sizeof(float));
    }
  }
}

int64_t DecoderModel::decode_weight_bytes() const {
  auto mlp_bytes = [](const MlpWeights& m) {
    return m.gate.total_bytes() + m.up.total_bytes() + m.down.total_bytes();
  };
  int64_t bytes = lm_head_.total_bytes() + embed_.total_bytes() / std::max<int64_t>(1, embed_.rows);
  for (const LayerWeights& L : layers_) {
    bytes += L.q.total_bytes() + L.k.total_bytes() + L.v.total_bytes() + L.o.total_bytes();
    if (L.moe) {
      bytes += L.moe->router.total_bytes();
      if (!L.moe->experts.empty()) bytes += L.moe->top_k * mlp_bytes(L.moe->experts.front());
    } else {
      bytes += mlp_bytes(L.mlp);
    }
  }
  return bytes;
}

}  // namespace turbokv
