// ModelConfig: everything the decoder needs from a Hugging Face config.json, with the family
// quirks resolved into plain flags and numbers (norm form, scales, soft-caps, per-layer
// sliding windows and RoPE tables). Family-specific parsing lives in family_*.cc.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/activation.h"
#include "model/model.h"

namespace turbokv {

// rope_parameters / rope_scaling of one attention type.
struct RopeConfig {
  std::string type = "default";  // default | linear | llama3 | yarn | dynamic
  double theta = 10000;
  double factor = 1;
  double partial_rotary_factor = 1;
  // llama3
  double low_freq_factor = 1, high_freq_factor = 4;
  // llama3, yarn, dynamic: the context the model was trained for
  int64_t original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32, beta_slow = 1;
  std::optional<double> attention_factor, mscale, mscale_all_dim;
  bool truncate = true;
};

// How one decoder layer mixes tokens. The CPU and CUDA forward passes and the cache policy all
// read this (with the per-kind parameters below); no family logic lives outside ModelConfig.
enum class LayerKind : uint8_t {
  kAttention,        // softmax attention over a KV cache (global, sliding or KV-shared)
  kLinearAttention,  // Gated DeltaNet: causal conv + gated delta rule on a recurrent state
  kMla,              // multi-head latent attention: a cache of one compressed row per token
};
const char* layer_kind_name(LayerKind kind);  // "attention", "linear_attention", "mla"

// Geometry of one softmax-attention layer (kAttention).
struct AttentionLayerConfig {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int sliding_window = 0;         // 0: global
  int kv_source = -1;             // >= 0: reads that earlier layer's cache, has no k/v_proj
  bool values_from_keys = false;  // no v_proj: V = v_norm(k_proj(x)) (gemma4 attention_k_eq_v)
};

// Gated DeltaNet sizes (kLinearAttention, qwen3_5). in_proj_qkv gives [q | k | v] with q, k of
// num_key_heads x key_head_dim and v of num_value_heads x value_head_dim; each key head serves
// num_value_heads / num_key_heads consecutive value heads.
struct LinearAttentionConfig {
  int num_key_heads = 0;
  int num_value_heads = 0;
  int key_head_dim = 0;
  int value_head_dim = 0;
  int conv_kernel = 0;  // linear_conv_kernel_dim
  int conv_channels() const {
    return 2 * num_key_heads * key_head_dim + num_value_heads * value_head_dim;
  }
};

// Multi-head latent attention sizes (kMla, deepseek_v3). The cache holds per token the
// normalized latent c (kv_lora_rank) and the shared rotated key part (qk_rope_head_dim); queries
// are absorbed into latent space (q_nope · W_uk), outputs expanded by W_uv.
struct MlaConfig {
  int q_lora_rank = 0;  // 0: a plain q_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool rope_interleave = false;  // rotary pairs are adjacent dims (deepseek's checkpoint layout)
  int latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

// How a sparse MLP picks its experts.
enum class MoeRouting : uint8_t {
  kSoftmaxTopK,         // qwen3_moe: softmax, top_k, optional renormalization
  kSigmoidGroupedTopK,  // deepseek_v3: sigmoid + correction bias, group-limited top_k,
                        // weights from the unbiased scores, normalized, times a scale
};

// The sizes and token ids the model reports (ModelInfo: model_type, vocab, hidden, layers,
// heads, head_dim, context, EOS/BOS ids) plus what only the decoder needs.
struct ModelConfig : ModelInfo {
  int intermediate_size = 0;
  double rms_norm_eps = 1e-6;
  Activation activation = Activation::kSilu;
  bool tie_word_embeddings = false;

  // Biases: q/k/v projections (qwen2, llama attention_bias), o_proj (llama attention_bias),
  // the MLP (llama mlp_bias).
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;           // per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
  bool norm_plus_one = false;     // RMSNorm weight applied as (1 + w) (gemma)
  bool sandwich_norms = false;    // post-attention, pre/post-feedforward norms (gemma2/3)
  bool fused_qkv = false;         // phi3 qkv_proj
  bool fused_gate_up = false;     // phi3 gate_up_proj
  float embedding_scale = 1;      // gemma: sqrt(hidden_size), rounded to the weights' dtype
  float attention_scale = 0;      // score = scale * <q, k>
  float attn_logit_softcap = 0;   // gemma2
  float final_logit_softcap = 0;  // gemma2

  std::vector<int> sliding_window;              // [num_layers], 0 = global attention
  std::vector<LayerKind> layer_kind;            // [num_layers]
  std::vector<AttentionLayerConfig> attention;  // [num_layers] (read for kAttention layers)
  bool attention_output_gate = false;  // q_proj gives [q, gate] per head; out *= sigmoid(gate)
  bool v_norm = false;                 // RMSNorm of V without a weight (gemma4)
  LinearAttentionConfig linear;
  MlaConfig mla;
  std::string weight_prefix = "model.";  // "model.language_model." in multimodal checkpoints

  // Per-layer inputs (gemma4): a second embedding of hidden_size_per_layer_input per layer,
  // mixed with a projection of the embeddings and added through a gated branch after the MLP.
  int per_layer_input_dim = 0;
  int per_layer_vocab = 0;
  bool layer_scalar = false;                // the residual stream is scaled by layer_scalar
  std::vector<int> intermediate_per_layer;  // [num_layers] when MLP widths differ
  RopeConfig rope;                          // global (full-attention) layers
  std::optional<RopeConfig> rope_local;     // sliding layers, when they differ (gemma3)

  // Mixture of experts (qwen3_moe); num_experts == 0 means a dense MLP everywhere.
  int num_experts = 0;
  int num_experts_per_token = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  std::vector<bool> moe_layer;  // [num_layers]
  MoeRouting moe_routing = MoeRouting::kSoftmaxTopK;
  int moe_groups = 1;       // n_group
  int moe_topk_groups = 1;  // topk_group
  float routed_scaling_factor = 1;
  int shared_expert_intermediate = 0;  // > 0: a shared expert MLP added to every token
  std::string shared_expert_name = "shared_experts";  // its weights: mlp.<name>.*_proj
  bool shared_expert_gate = false;  // qwen3_5_moe: the shared expert's output times
                                    // sigmoid(x · mlp.shared_expert_gate)
};

// Reads dir/config.json (and generation_config.json for EOS ids). Throws IoError when missing,
// FormatError naming the field for a malformed value, Unsupported naming the architecture and
// the supported ones.
ModelConfig load_model_config(const std::string& dir);
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& path);

// The model_type values load_model_config accepts, comma-separated.
std::string supported_model_types();

}  // namespace turbokv
