// DecoderModel: the one decoder-only transformer every supported family is an instance of.
// Family differences are flags and numbers in ModelConfig (norm form, biases, q/k norm,
// sandwich norms, soft-caps, sliding layers, local RoPE, fused projections, MoE, layer kinds).
//
// Per layer, for the T tokens of all chunks of a step together:
//   xn = norm(x); token mixing by the layer's kind:
//     attention        : q, k, v = xn·Wqᵀ, xn·Wkᵀ, xn·Wvᵀ (+bias); [q/k norm]; RoPE(q, k)
//                        per sequence: cache.append(k, v); attn = cache.attend(q)
//                        [attn *= sigmoid(gate)]; a = attn·Woᵀ
//     linear_attention : Gated DeltaNet on the sequence's RecurrentState (linear_attention.h)
//     mla              : latent attention on a cache of latent rows (mla.h)
//   [a = norm(a)]; x += a
//   xn = norm(x); f = mlp(xn) or moe(xn); [f = norm(f)]; x += f
//   [per-layer input branch]; [x *= layer_scalar]
#pragma once

#include <optional>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"

namespace turbokv {

struct MlpWeights {
  WeightMatrix gate, up, down;                       // [I, H], [I, H], [H, I]
  std::vector<float> gate_bias, up_bias, down_bias;  // empty when the model has none
};

// out[n, H] = down(act(gate(x)) * up(x)) for x [n, H].
void mlp_forward(const MlpWeights& w, Activation act, const float* x, int64_t n, float* out);

struct MoeWeights {
  WeightMatrix router;              // [experts, H]
  std::vector<MlpWeights> experts;  // each with intermediate size moe_intermediate_size
  int top_k = 0;
  bool norm_topk_prob = false;
  MoeRouting routing = MoeRouting::kSoftmaxTopK;
  std::vector<float> score_bias;  // [experts], kSigmoidGroupedTopK: e_score_correction_bias
  int groups = 1, topk_groups = 1;
  float routed_scale = 1;
  std::optional<MlpWeights> shared_expert;  // added for every token
  WeightMatrix shared_gate;                 // [1, H]: set when the shared expert is gated
};

// Sparse block: the router picks top_k experts per token (moe_route), out = Σ weight_e ·
// expert_e(x) (+ shared_expert(x), times sigmoid(x · shared_gate) when gated).
void moe_forward(const MoeWeights& w, Activation act, const float* x, int64_t n, int64_t hidden,
                 float* out);
// Expert choice for one token from its router logits [experts]: softmax top-k (qwen3_moe,
// family_qwen3_moe.cc) or sigmoid group-limited top-k (deepseek_v3, family_deepseek_v3.cc).
void moe_route(const MoeWeights& w, float* logits, int* experts, float* weights);
void moe_route_sigmoid_grouped(const MoeWeights& w, const float* logits, int* experts,
                               float* weights);

// Gated DeltaNet weights (qwen3_5 linear_attn.*).
struct LinearAttentionWeights {
  WeightMatrix qkv, z, b, a, out;     // [C, H], [Hv*dv, H], [Hv, H], [Hv, H], [H, Hv*dv]
  std::vector<float> conv;            // [C, K]
  std::vector<float> a_log, dt_bias;  // [Hv]
  std::vector<float> norm;            // [dv], weight of the gated RMSNorm (plain w)
};

// Multi-head latent attention weights (deepseek_v3 self_attn.*), with kv_b_proj split per head
// for query absorption and value expansion.
struct MlaWeights {
  WeightMatrix q, q_a, q_b;      // q: [heads*(nope+rope), H] without q_lora_rank; else q_a, q_b
  std::vector<float> q_a_norm;   // [q_lora_rank]
  WeightMatrix kv_a;             // [r + rope, H]
  std::vector<float> kv_a_norm;  // [r]
  std::vector<std::vector<float>> absorb_storage;
  std::vector<WeightMatrix> absorb;  // per head W_ukᵀ: [r, nope] (f32, owned above)
  std::vector<WeightMatrix> expand;  // per head W_uv: [v, r] (rows of kv_b_proj)
  WeightMatrix o;                    // [H, heads*v]
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;              // [H]
  std::vector<float> pre_feedforward_norm, post_feedforward_norm;  // [H], sandwich norms only
  std::vector<float> q_norm, k_norm;                               // [head_dim], qk_norm only
  WeightMatrix q, k, v, o;  // [heads*hd, H], [kv*hd, H], [kv*hd, H], [H, heads*hd]
  std::vector<float> q_bias, k_bias, v_bias, o_bias;
  MlpWeights mlp;
  std::optional<MoeWeights> moe;  // set: the layer's MLP is the sparse block
  LinearAttentionWeights linear;  // kLinearAttention layers
  std::optional<MlaWeights> mla;  // kMla layers
  // Per-layer input branch (gemma4): gate [P, H], projection [H, P], its post norm [H].
  WeightMatrix per_layer_gate, per_layer_projection;
  std::vector<float> per_layer_norm;
  float layer_scalar = 1;
};

// What the cache policy needs per layer, from the configuration alone (no weights).
std::vector<LayerSpec> layer_specs_for(const ModelConfig& c);

// One sequence's rows within a step and that sequence's cache (or state) for the layer.
struct SequenceRows {
  KVCache* cache = nullptr;
  int64_t row = 0;  // first row in the step's [T, ...] buffers
  int count = 0;
};

// qwen3_5 linear-attention layer (linear_attention.cc): out [T, H] from xn [T, H], each
// sequence's rows advancing its RecurrentState (chunked form for several tokens, the recurrence
// for one).
void linear_attention_block(const LinearAttentionWeights& w, const ModelConfig& c,
                            const std::vector<SequenceRows>& rows, const float* xn, int64_t T,
                            float* out);
// deepseek_v3 latent attention layer (mla.cc): out [T, H] from xn [T, H].
void mla_block(const MlaWeights& w, const ModelConfig& c, const std::vector<SequenceRows>& rows,
               const float* xn, const int64_t* positions, int64_t T, float* out);
MlaWeights load_mla_weights(const WeightStore& store, const std::string& prefix,
                            const ModelConfig& c);

class DecoderModel final : public Model {
 public:
  DecoderModel(ModelConfig config, WeightStore weights);

  const ModelInfo& info() const override { return config_; }
  std::vector<LayerSpec> layer_specs() const override;
  void forward(std::span<const Chunk> chunks) const override;
  int64_t decode_weight_bytes() const override;

  const ModelConfig& config() const { return config_; }
  // The bound weights (memory-mapped), for other executors of the same description (the CUDA
  // forward uploads them).
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const WeightMatrix& embedding() const { return embed_; }
  const WeightMatrix& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  float embedding_scale() const { return embedding_scale_; }  // in the weights' dtype
  // gemma4 per-layer inputs: the per-layer embedding [vocab, layers * P], the projection of the
  // embeddings [layers * P, H] and its norm [P] (empty without per-layer inputs).
  const WeightMatrix& per_layer_embedding() const { return per_layer_embed_; }
  const WeightMatrix& per_layer_model_projection() const { return per_layer_model_projection_; }
  const std::vector<float>& per_layer_projection_norm() const {
    return per_layer_projection_norm_;
  }

 private:
  // A contiguous piece of one chunk's tokens inside a step.
  void run_step(const std::vector<ChunkSlice>& slices) const;
  void attention_block(const LayerWeights& layer, int index, const std::vector<ChunkSlice>& slices,
                       const int64_t* positions, int64_t n_tokens, float* x) const;
  void feed_forward_block(const LayerWeights& layer, int64_t n_tokens, float* x) const;
  // gemma4: per-layer inputs [T, layers, P] from the tokens and the scaled embeddings x.
  std::vector<float> per_layer_inputs(const int32_t* tokens, const float* x, int64_t T) const;
  void per_layer_input_block(const LayerWeights& layer, const float* input, int64_t T,
                             float* x) const;
  void write_logits(const std::vector<ChunkSlice>& slices, const float* x) const;
  std::vector<float> norm_weight(const std::string& name, int64_t n) const;

  ModelConfig config_;
  WeightStore weights_;
  WeightMatrix embed_, lm_head_;
  float embedding_scale_ = 1;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
  WeightMatrix per_layer_embed_, per_layer_model_projection_;  // gemma4 per-layer inputs
  std::vector<float> per_layer_projection_norm_;
};

}  // namespace turbokv
