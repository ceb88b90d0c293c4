// Architecture families: each family_*.cc reads its config.json quirks into ModelConfig.
// Model::load dispatches on config.json "model_type" through kFamilies.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"

namespace turbokv {

// Fills the family-specific parts of c; the common fields are already parsed.
using ConfigureFamily = void (*)(const nlohmann::json& j, const std::string& path, ModelConfig& c);

void configure_llama(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_mistral(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_qwen2(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_qwen3(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_gemma2(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_gemma3_text(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_phi3(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_qwen3_moe(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_qwen3_5(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_gemma4_text(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void configure_deepseek_v3(const nlohmann::json& j, const std::string& path, ModelConfig& c);

struct Family {
  const char* model_type;
  ConfigureFamily configure;
};

inline constexpr Family kFamilies[] = {
    {"llama", configure_llama},
    {"mistral", configure_mistral},
    {"qwen2", configure_qwen2},
    {"qwen3", configure_qwen3},
    {"gemma2", configure_gemma2},
    {"gemma3_text", configure_gemma3_text},
    {"phi3", configure_phi3},
    {"qwen3_moe", configure_qwen3_moe},
    {"qwen3_5_text", configure_qwen3_5},
    {"qwen3_5", configure_qwen3_5},
    {"qwen3_5_moe_text", configure_qwen3_5},
    {"qwen3_5_moe", configure_qwen3_5},
    {"gemma4_text", configure_gemma4_text},
    {"deepseek_v3", configure_deepseek_v3},
};

// Sliding layers of families whose config lacks "layer_types": every layer slides when the
// config has a sliding_window (mistral, phi3); qwen2-style: layers >= max_window_layers slide
// when use_sliding_window is true.
void set_uniform_sliding_window(const nlohmann::json& j, const std::string& path, ModelConfig& c);
void set_qwen_sliding_window(const nlohmann::json& j, const std::string& path, ModelConfig& c);

}  // namespace turbokv
