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

  std::vector<int> sliding_window;       // [num_layers], 0 = global attention
  RopeConfig rope;                       // global (full-attention) layers
  std::optional<RopeConfig> rope_local;  // sliding layers, when they differ (gemma3)

  // Mixture of experts (qwen3_moe); num_experts == 0 means a dense MLP everywhere.
  int num_experts = 0;
  int num_experts_per_token = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  std::vector<bool> moe_layer;  // [num_layers]
};

// Reads dir/config.json (and generation_config.json for EOS ids). Throws IoError when missing,
// FormatError naming the field for a malformed value, Unsupported naming the architecture and
// the supported ones.
ModelConfig load_model_config(const std::string& dir);
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& path);

// The model_type values load_model_config accepts, comma-separated.
std::string supported_model_types();

}  // namespace turbokv
