// DecoderModel: the one decoder-only transformer every supported family is an instance of.
// Family differences are flags and numbers in ModelConfig (norm form, biases, q/k norm,
// sandwich norms, soft-caps, sliding layers, local RoPE, fused projections, MoE).
//
// Per layer, for the T tokens of all chunks of a step together:
//   xn = norm(x); q, k, v = xn·Wqᵀ, xn·Wkᵀ, xn·Wvᵀ (+bias); [q/k norm]; RoPE(q, k)
//   per sequence: cache.append(k, v); attn = cache.attend(q)
//   a = attn·Woᵀ; [a = norm(a)]; x += a
//   xn = norm(x); f = mlp(xn) or moe(xn); [f = norm(f)]; x += f
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
};

// Qwen3-MoE sparse block (family_qwen3_moe.cc): softmax over the router logits, the top_k
// experts per token (renormalized when norm_topk_prob), out = Σ weight_e · expert_e(x).
void moe_forward(const MoeWeights& w, Activation act, const float* x, int64_t n, int64_t hidden,
                 float* out);

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;              // [H]
  std::vector<float> pre_feedforward_norm, post_feedforward_norm;  // [H], sandwich norms only
  std::vector<float> q_norm, k_norm;                               // [head_dim], qk_norm only
  WeightMatrix q, k, v, o;  // [heads*hd, H], [kv*hd, H], [kv*hd, H], [H, heads*hd]
  std::vector<float> q_bias, k_bias, v_bias, o_bias;
  MlpWeights mlp;
  std::optional<MoeWeights> moe;  // set: the layer's MLP is the sparse block
};

class DecoderModel final : public Model {
 public:
  DecoderModel(ModelConfig config, WeightStore weights);

  const ModelInfo& info() const override { return config_; }
  std::vector<LayerSpec> layer_specs() const override;
  void forward(std::span<const Chunk> chunks) const override;
  int64_t decode_weight_bytes() const override;

  const ModelConfig& config() const { return config_; }

 private:
  // A contiguous piece of one chunk's tokens inside a step.
  struct Slice {
    const Chunk* chunk;
    int begin;  // first token of the chunk in this slice
    int count;
  };
  void run_step(const std::vector<Slice>& slices) const;
  void attention_block(const LayerWeights& layer, int index, const std::vector<Slice>& slices,
                       const int64_t* positions, int64_t n_tokens, float* x) const;
  void feed_forward_block(const LayerWeights& layer, int64_t n_tokens, float* x) const;
  void write_logits(const std::vector<Slice>& slices, const float* x) const;
  std::vector<float> norm_weight(const std::string& name, int64_t n) const;

  ModelConfig config_;
  WeightStore weights_;
  WeightMatrix embed_, lm_head_;
  float embedding_scale_ = 1;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
};

}  // namespace turbokv
