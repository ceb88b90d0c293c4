// Llama-style families: pre-norm decoder, RMSNorm, SwiGLU MLP, RoPE.
//   llama   : optional attention_bias (q/k/v/o) and mlp_bias
//   mistral : sliding_window on every layer
//   qwen2   : q/k/v bias; sliding layers from use_sliding_window / max_window_layers
//   qwen3   : qwen2 without forced bias, plus per-head RMSNorm of q and k before RoPE
#include "core/error.h"
#include "model/config_json.h"
#include "model/families.h"

namespace turbokv {

using config_json::get_bool;
using config_json::get_int;

void set_uniform_sliding_window(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  if (j.contains("layer_types")) return;
  const int64_t window = get_int(j, "sliding_window", path, 0, config_json::kIntMax).value_or(0);
  if (window > 0) c.sliding_window.assign(size_t(c.num_layers), int(window));
}

void set_qwen_sliding_window(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  if (j.contains("layer_types") || !get_bool(j, "use_sliding_window", path).value_or(false)) return;
  const int64_t window = get_int(j, "sliding_window", path, 0, config_json::kIntMax).value_or(0);
  const int64_t first =
      get_int(j, "max_window_layers", path, 0, config_json::kIntMax).value_or(c.num_layers);
  for (int64_t i = first; i < c.num_layers && window > 0; ++i)
    c.sliding_window[size_t(i)] = int(window);
}

void configure_llama(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", path).value_or(false);
  c.mlp_bias = get_bool(j, "mlp_bias", path).value_or(false);
}

void configure_mistral(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  set_uniform_sliding_window(j, path, c);
}

void configure_qwen2(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  c.qkv_bias = true;
  set_qwen_sliding_window(j, path, c);
}

void configure_qwen3(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  c.qkv_bias = c.o_bias = get_bool(j, "attention_bias", path).value_or(false);
  c.qk_norm = true;
  set_qwen_sliding_window(j, path, c);
}

}  // namespace turbokv
