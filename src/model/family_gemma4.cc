// Gemma 4 text (gemma4_text; gemma4 wraps it in text_config). Beyond gemma3:
//  - RMSNorm weighs by w (not 1 + w); V gets a weightless RMSNorm; attention scale 1 (the q/k
//    norms set the scale);
//  - sliding and global layers differ in head_dim (per_layer_config, or global_head_dim) and,
//    with attention_k_eq_v, global layers have no v_proj (V = v_norm(k_proj(x))) and their own
//    KV head count (num_global_key_value_heads);
//  - the last num_kv_shared_layers layers have no k/v projections and read the cache of the
//    last earlier layer of their type;
//  - per-layer inputs (hidden_size_per_layer_input) and a per-layer residual scale;
//  - global layers use "proportional" RoPE over their head_dim.
#include <cmath>

#include "core/error.h"
#include "model/config_json.h"
#include "model/families.h"

namespace turbokv {

using config_json::get_bool;
using config_json::get_int;
using config_json::get_number;
using config_json::get_string;

void configure_gemma4_text(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", path).value_or(true);
  c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", path).value_or(false);
  c.norm_plus_one = false;
  c.sandwich_norms = true;
  c.qk_norm = true;
  c.v_norm = true;
  c.embedding_scale = float(std::sqrt(double(c.hidden_size)));
  c.attention_scale = 1.0f;
  c.final_logit_softcap = float(get_number(j, "final_logit_softcapping", path).value_or(0));
  c.layer_scalar = true;
  if (get_bool(j, "enable_moe_block", path).value_or(false)) {
    throw Unsupported(str_cat(path, ": gemma4 with enable_moe_block is not supported"));
  }
  if (get_string(j, "use_bidirectional_attention", path).value_or("") == "all") {
    throw Unsupported(str_cat(path, ": bidirectional gemma4 attention is not supported"));
  }

  // Per-layer geometry: per_layer_config (transformers >= 5.15) or the flat global_* names.
  const bool k_eq_v = get_bool(j, "attention_k_eq_v", path).value_or(false);
  const int global_head_dim = int(get_int(j, "global_head_dim", path).value_or(0));
  const int global_kv_heads = int(get_int(j, "num_global_key_value_heads", path).value_or(0));
  const nlohmann::json* per_layer = nullptr;
  if (auto it = j.find("per_layer_config"); it != j.end() && it->is_object()) per_layer = &*it;
  c.attention.assign(size_t(c.num_layers), AttentionLayerConfig{});
  for (int l = 0; l < c.num_layers; ++l) {
    AttentionLayerConfig& a = c.attention[size_t(l)];
    const bool global = c.sliding_window[size_t(l)] == 0;
    a.num_heads = c.num_heads;
    a.num_kv_heads = c.num_kv_heads;
    a.head_dim = c.head_dim;
    if (global && global_head_dim > 0) a.head_dim = global_head_dim;
    if (global && k_eq_v && global_kv_heads > 0) a.num_kv_heads = global_kv_heads;
    if (per_layer != nullptr) {
      if (auto it = per_layer->find(std::to_string(l)); it != per_layer->end()) {
        const std::string where = str_cat(path, " per_layer_config.", l);
        a.head_dim = int(get_int(*it, "head_dim", where).value_or(a.head_dim));
        a.num_heads = int(get_int(*it, "num_attention_heads", where).value_or(a.num_heads));
        a.num_kv_heads = int(get_int(*it, "num_key_value_heads", where).value_or(a.num_kv_heads));
      }
    }
    a.values_from_keys = k_eq_v && global;
  }

  // KV sharing: layer l >= first_shared reads the last earlier non-shared layer of its type.
  const int shared = int(get_int(j, "num_kv_shared_layers", path).value_or(0));
  const int first_shared = c.num_layers - shared;
  if (shared < 0 || shared >= c.num_layers) {
    throw FormatError(
        str_cat(path, ": num_kv_shared_layers ", shared, " must be in 0..", c.num_layers - 1));
  }
  for (int l = first_shared; l < c.num_layers && shared > 0; ++l) {
    const bool sliding = c.sliding_window[size_t(l)] > 0;
    int source = -1;
    for (int s = first_shared - 1; s >= 0 && source < 0; --s) {
      if ((c.sliding_window[size_t(s)] > 0) == sliding) source = s;
    }
    if (source < 0) {
      throw FormatError(
          str_cat(path, ": KV-shared layer ", l, " has no earlier layer of its type to read"));
    }
    c.attention[size_t(l)].kv_source = source;
  }

  const bool double_wide = get_bool(j, "use_double_wide_mlp", path).value_or(false);
  c.intermediate_per_layer.assign(size_t(c.num_layers), c.intermediate_size);
  for (int l = first_shared; l < c.num_layers && double_wide && first_shared > 0; ++l) {
    c.intermediate_per_layer[size_t(l)] = 2 * c.intermediate_size;
  }

  c.per_layer_input_dim = int(get_int(j, "hidden_size_per_layer_input", path).value_or(0));
  c.per_layer_vocab = int(get_int(j, "vocab_size_per_layer_input", path).value_or(c.vocab_size));
  if (c.per_layer_input_dim < 0 || (c.per_layer_input_dim > 0 && c.per_layer_vocab <= 0)) {
    throw FormatError(str_cat(path, ": hidden_size_per_layer_input ", c.per_layer_input_dim,
                              " / vocab_size_per_layer_input ", c.per_layer_vocab,
                              " must be positive"));
  }
}

}  // namespace turbokv
