// Models from one GGUF file: the model config from its `<arch>.*` metadata (as the
// config.json the same model has on the Hugging Face side, then the family's own parsing),
// and the map from GGUF tensor names (token_embd, blk.N.attn_q, ...) to Hugging Face names.
// Architectures: llama, mistral, qwen2, qwen3, gemma2, gemma3.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/gguf.h"
#include "model/config.h"
#include "model/weights.h"

namespace turbokv {

// The config.json equivalent of the file's metadata. Throws Unsupported naming an
// architecture outside the list above (and the list), FormatError naming a missing or
// malformed key.
nlohmann::json gguf_model_config_json(const GgufFile& file);
// Parsed and adjusted for what the GGUF converter already applied (gemma's 1 + w norms).
ModelConfig gguf_model_config(const GgufFile& file);
// The tensor names for config (q/k permutation undone for llama and mistral).
GgufTensorMap gguf_tensor_map(const GgufFile& file, const ModelConfig& config);

}  // namespace turbokv
