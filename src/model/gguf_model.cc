// GGUF metadata -> config.json equivalent -> ModelConfig, and GGUF -> Hugging Face tensor names
// (gguf_model.h).
#include "model/gguf_model.h"

#include <cstring>

#include "core/error.h"

namespace turbokv {
namespace {

struct Arch {
  const char* gguf;        // general.architecture
  const char* model_type;  // config.json model_type
  bool permuted_qk;        // llama.cpp's converter permuted q/k rows
  bool gemma;
};

constexpr Arch kArchs[] = {
    {"llama", "llama", true, false},   {"mistral", "mistral", true, false},
    {"qwen2", "qwen2", false, false},  {"qwen3", "qwen3", false, false},
    {"gemma2", "gemma2", false, true}, {"gemma3", "gemma3_text", false, true},
};

const Arch& find_arch(const GgufFile& f) {
  const std::optional<std::string> name = f.get_string("general.architecture");
  if (!name) {
    throw FormatError(str_cat(f.path(), ": metadata 'general.architecture' is missing"));
  }
  std::string names;
  for (const Arch& a : kArchs) {
    if (*name == a.gguf) return a;
    names += str_cat(names.empty() ? "" : ", ", a.gguf);
  }
  throw Unsupported(
      str_cat(f.path(), ": architecture '", *name, "' is not supported (supported: ", names, ")"));
}

}  // namespace

nlohmann::json gguf_model_config_json(const GgufFile& f) {
  const Arch& arch = find_arch(f);
  const std::string p = std::string(arch.gguf) + ".";
  auto require = [&](const std::string& key) {
    const std::optional<int64_t> v = f.get_int(p + key);
    if (!v) throw FormatError(str_cat(f.path(), ": metadata '", p, key, "' is missing"));
    return *v;
  };
  nlohmann::json j;
  j["model_type"] = arch.model_type;
  j["hidden_size"] = require("embedding_length");
  j["num_hidden_layers"] = require("block_count");
  j["intermediate_size"] = require("feed_forward_length");
  j["num_attention_heads"] = require("attention.head_count");
  const int64_t heads = j["num_attention_heads"];
  j["num_key_value_heads"] = f.get_int(p + "attention.head_count_kv").value_or(heads);
  const int64_t head_dim = f.get_int(p + "attention.key_length")
                               .value_or(heads > 0 ? j["hidden_size"].get<int64_t>() / heads : 0);
  j["head_dim"] = head_dim;
  if (auto v = f.get_int(p + "context_length")) j["max_position_embeddings"] = *v;
  if (auto v = f.get_number(p + "attention.layer_norm_rms_epsilon")) j["rms_norm_eps"] = *v;
  j["rope_theta"] = f.get_number(p + "rope.freq_base").value_or(10000.0);
  if (auto dims = f.get_int(p + "rope.dimension_count"); dims && head_dim > 0) {
    j["partial_rotary_factor"] = double(*dims) / double(head_dim);
  }
  if (f.find_tensor("rope_freqs.weight") != nullptr) {
    throw Unsupported(str_cat(f.path(),
                              ": tensor 'rope_freqs.weight' (per-dimension RoPE "
                              "frequency factors) is not supported"));
  }
  if (auto type = f.get_string(p + "rope.scaling.type"); type && *type != "none") {
    if (*type != "linear" && *type != "yarn") {
      throw Unsupported(str_cat(f.path(), ": metadata '", p, "rope.scaling.type' is '", *type,
                                "' (supported: none, linear, yarn)"));
    }
    nlohmann::json scaling = {{"rope_type", *type},
                              {"factor", f.get_number(p + "rope.scaling.factor").value_or(1.0)}};
    if (auto orig = f.get_int(p + "rope.scaling.original_context_length")) {
      scaling["original_max_position_embeddings"] = *orig;
    }
    j["rope_scaling"] = scaling;
  }
  int64_t vocab = f.get_int(p + "vocab_size").value_or(0);
  if (vocab == 0) {
    if (const auto* tokens = f.get_strings("tokenizer.ggml.tokens"))
      vocab = int64_t(tokens->size());
  }
  if (vocab == 0) {
    if (const GgufTensor* t = f.find_tensor("token_embd.weight"); t && t->ne.size() == 2) {
      vocab = t->ne[1];
    }
  }
  j["vocab_size"] = vocab;
  j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  j["attention_bias"] = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  if (auto v = f.get_int("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = *v;
  nlohmann::json eos = nlohmann::json::array();
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (auto v = f.get_int(key); v && std::find(eos.begin(), eos.end(), *v) == eos.end()) {
      eos.push_back(*v);
    }
  }
  if (!eos.empty()) j["eos_token_id"] = eos;
  if (arch.gemma) {
    j["hidden_activation"] = "gelu_pytorch_tanh";
    if (auto v = f.get_number(p + "attn_logit_softcapping")) j["attn_logit_softcapping"] = *v;
    if (auto v = f.get_number(p + "final_logit_softcapping")) j["final_logit_softcapping"] = *v;
    if (auto v = f.get_int(p + "attention.sliding_window")) j["sliding_window"] = *v;
  } else if (auto v = f.get_int(p + "attention.sliding_window")) {
    j["sliding_window"] = *v;
    if (std::strcmp(arch.gguf, "qwen2") == 0 || std::strcmp(arch.gguf, "qwen3") == 0) {
      j["use_sliding_window"] = true;
    }
  }
  return j;
}

ModelConfig gguf_model_config(const GgufFile& f) {
  ModelConfig c = parse_model_config(gguf_model_config_json(f), f.path());
  // llama.cpp's converter stores gemma's RMSNorm weights as 1 + w already.
  if (find_arch(f).gemma) c.norm_plus_one = false;
  return c;
}

GgufTensorMap gguf_tensor_map(const GgufFile& f, const ModelConfig& c) {
  const Arch& arch = find_arch(f);
  GgufTensorMap map;
  auto& m = map.hf_to_gguf;
  m["model.embed_tokens.weight"] = "token_embd.weight";
  m["model.norm.weight"] = "output_norm.weight";
  m["lm_head.weight"] = "output.weight";
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string hf = str_cat("model.layers.", l, "."), g = str_cat("blk.", l, ".");
    m[hf + "input_layernorm.weight"] = g + "attn_norm.weight";
    if (arch.gemma) {
      m[hf + "post_attention_layernorm.weight"] = g + "post_attention_norm.weight";
      m[hf + "pre_feedforward_layernorm.weight"] = g + "ffn_norm.weight";
      m[hf + "post_feedforward_layernorm.weight"] = g + "post_ffw_norm.weight";
    } else {
      m[hf + "post_attention_layernorm.weight"] = g + "ffn_norm.weight";
    }
    const std::pair<const char*, const char*> attn[] = {{"q_proj", "attn_q"},
                                                        {"k_proj", "attn_k"},
                                                        {"v_proj", "attn_v"},
                                                        {"o_proj", "attn_output"}};
    for (const auto& [hf_name, g_name] : attn) {
      m[hf + "self_attn." + hf_name + ".weight"] = g + g_name + ".weight";
      m[hf + "self_attn." + hf_name + ".bias"] = g + g_name + ".bias";
    }
    m[hf + "self_attn.q_norm.weight"] = g + "attn_q_norm.weight";
    m[hf + "self_attn.k_norm.weight"] = g + "attn_k_norm.weight";
    m[hf + "mlp.gate_proj.weight"] = g + "ffn_gate.weight";
    m[hf + "mlp.up_proj.weight"] = g + "ffn_up.weight";
    m[hf + "mlp.down_proj.weight"] = g + "ffn_down.weight";
    if (arch.permuted_qk) {
      for (const char* suffix : {".weight", ".bias"}) {
        map.permuted_heads[g + "attn_q" + suffix] = c.num_heads;
        map.permuted_heads[g + "attn_k" + suffix] = c.num_kv_heads;
      }
    }
  }
  return map;
}

}  // namespace turbokv
