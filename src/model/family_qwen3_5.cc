// Qwen3.5 (qwen3_5_text; qwen3_5 wraps it in text_config): a hybrid of Gated DeltaNet
// linear-attention layers (layer_types "linear_attention", or all but every
// full_attention_interval-th layer) and full-attention layers. All RMSNorms but the gated one
// inside linear attention weigh by (1 + w). Full-attention layers: q_proj gives a query and a
// sigmoid output gate per head, q/k RMSNorm, partial rotary (partial_rotary_factor) with
// multimodal-RoPE sections that coincide for text positions (one position for all sections).
#include "core/error.h"
#include "model/config_json.h"
#include "model/families.h"

namespace turbokv {

using config_json::get_bool;
using config_json::get_int;
using config_json::require_int;

void configure_qwen3_5(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", path).value_or(false);
  c.qk_norm = true;
  c.norm_plus_one = true;
  c.attention_output_gate = get_bool(j, "attn_output_gate", path).value_or(true);
  // The MoE variant (qwen3_5_moe): every layer's MLP is sparse, with a gated shared expert;
  // transformers' router always renormalizes its top_k weights.
  c.num_experts = int(get_int(j, "num_experts", path, 0, config_json::kIntMax).value_or(0));
  if (c.num_experts > 0) {
    c.num_experts_per_token =
        int(get_int(j, "num_experts_per_tok", path, 0, config_json::kIntMax).value_or(0));
    c.moe_intermediate_size =
        int(get_int(j, "moe_intermediate_size", path, 0, config_json::kIntMax).value_or(0));
    c.shared_expert_intermediate = int(
        get_int(j, "shared_expert_intermediate_size", path, 0, config_json::kIntMax).value_or(0));
    if (c.num_experts_per_token <= 0 || c.num_experts_per_token > c.num_experts ||
        c.moe_intermediate_size <= 0) {
      throw FormatError(str_cat(path, ": num_experts_per_tok ", c.num_experts_per_token,
                                " must be in 1..", c.num_experts, " and moe_intermediate_size ",
                                c.moe_intermediate_size, " > 0"));
    }
    c.norm_topk_prob = true;
    c.moe_routing = MoeRouting::kSoftmaxTopK;
    c.shared_expert_name = "shared_expert";
    c.shared_expert_gate = c.shared_expert_intermediate > 0;
    c.moe_layer.assign(size_t(c.num_layers), true);
  }
  LinearAttentionConfig& la = c.linear;
  la.num_key_heads = int(require_int(j, "linear_num_key_heads", path));
  la.num_value_heads = int(require_int(j, "linear_num_value_heads", path));
  la.key_head_dim = int(require_int(j, "linear_key_head_dim", path));
  la.value_head_dim = int(require_int(j, "linear_value_head_dim", path));
  la.conv_kernel = int(get_int(j, "linear_conv_kernel_dim", path).value_or(4));
  if (la.num_key_heads <= 0 || la.num_value_heads <= 0 || la.key_head_dim <= 0 ||
      la.value_head_dim <= 0 || la.conv_kernel <= 0 || la.num_value_heads % la.num_key_heads != 0) {
    throw FormatError(str_cat(path, ": linear attention has ", la.num_key_heads, " key heads of ",
                              la.key_head_dim, ", ", la.num_value_heads, " value heads of ",
                              la.value_head_dim, ", conv kernel ", la.conv_kernel,
                              " (all positive, value heads a multiple of key heads)"));
  }
  if (!j.contains("layer_types") || j["layer_types"].is_null()) {
    const int64_t interval = get_int(j, "full_attention_interval", path).value_or(4);
    if (interval <= 0) {
      throw FormatError(str_cat(path, ": full_attention_interval ", interval, " must be > 0"));
    }
    for (int l = 0; l < c.num_layers; ++l) {
      c.layer_kind[size_t(l)] =
          (l + 1) % interval == 0 ? LayerKind::kAttention : LayerKind::kLinearAttention;
    }
  }
}

}  // namespace turbokv
