// Gemma families: RMSNorm as x * (1 + w), norms before and after both attention and MLP
// ("sandwich"), embeddings scaled by sqrt(hidden_size), GeGLU (gelu_pytorch_tanh), attention
// scale query_pre_attn_scalar^-1/2, tied embeddings by default.
//   gemma2      : attention and final logit soft-capping; every other layer slides (0, 2, ...)
//   gemma3_text : q/k RMSNorm; 5 of 6 layers slide (_sliding_window_pattern) and use the local
//                 RoPE base (rope_local_base_freq / rope_parameters.sliding_attention)
#include <cmath>

#include "core/error.h"
#include "model/config_json.h"
#include "model/families.h"

namespace turbokv {
namespace {

using config_json::get_bool;
using config_json::get_int;
using config_json::get_number;

void configure_gemma_common(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", path).value_or(true);
  c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", path).value_or(false);
  c.norm_plus_one = true;
  c.sandwich_norms = true;
  c.embedding_scale = float(std::sqrt(double(c.hidden_size)));
  const double scalar = get_number(j, "query_pre_attn_scalar", path).value_or(c.head_dim);
  if (!(scalar > 0)) {
    throw FormatError(str_cat(path, ": query_pre_attn_scalar ", scalar, " must be > 0"));
  }
  c.attention_scale = float(1.0 / std::sqrt(scalar));
  c.attn_logit_softcap = float(get_number(j, "attn_logit_softcapping", path).value_or(0));
  c.final_logit_softcap = float(get_number(j, "final_logit_softcapping", path).value_or(0));
}

// Layers whose (index + 1) is not a multiple of pattern slide.
void set_pattern_sliding_window(const nlohmann::json& j, const std::string& path, int pattern,
                                ModelConfig& c) {
  if (j.contains("layer_types")) return;
  const int64_t window = get_int(j, "sliding_window", path, 0, config_json::kIntMax).value_or(0);
  for (int i = 0; i < c.num_layers && window > 0 && pattern > 0; ++i) {
    if ((i + 1) % pattern != 0) c.sliding_window[size_t(i)] = int(window);
  }
}

}  // namespace

void configure_gemma2(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  configure_gemma_common(j, path, c);
  set_pattern_sliding_window(j, path, 2, c);
}

void configure_gemma3_text(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  configure_gemma_common(j, path, c);
  c.qk_norm = true;
  std::optional<int64_t> pattern =
      get_int(j, "_sliding_window_pattern", path, 0, config_json::kIntMax);
  if (!pattern) pattern = get_int(j, "sliding_window_pattern", path, 0, config_json::kIntMax);
  set_pattern_sliding_window(j, path, int(pattern.value_or(6)), c);
  // transformers 4 style: the local base sits next to rope_theta.
  if (!c.rope_local) {
    RopeConfig local;
    local.theta = get_number(j, "rope_local_base_freq", path).value_or(10000);
    local.partial_rotary_factor = c.rope.partial_rotary_factor;
    c.rope_local = local;
  }
}

}  // namespace turbokv
