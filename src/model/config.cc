// config.json -> ModelConfig: the fields every family shares (sizes, norms, activation, RoPE
// parameters, layer types, EOS ids), then the family's own quirks (families.h).
#include "model/config.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/text_file.h"
#include "model/config_json.h"
#include "model/families.h"

namespace turbokv {
namespace {

using config_json::get_bool;
using config_json::get_int;
using config_json::get_number;
using config_json::get_string;
using config_json::require_int;

Activation parse_activation(const nlohmann::json& j, const std::string& path) {
  std::optional<std::string> name = get_string(j, "hidden_activation", path);
  if (!name) name = get_string(j, "hidden_act", path);
  if (!name || *name == "silu" || *name == "swish") return Activation::kSilu;
  if (*name == "gelu_pytorch_tanh" || *name == "gelu_tanh" || *name == "gelu_new") {
    return Activation::kGeluTanh;
  }
  throw Unsupported(str_cat(path, ": activation '", *name,
                            "' is not supported (supported: silu, gelu_pytorch_tanh)"));
}

// One rope_parameters / rope_scaling object; fields absent there fall back to the top level
// (transformers 4 style: rope_theta, partial_rotary_factor next to rope_scaling).
RopeConfig parse_rope(const nlohmann::json& params, const nlohmann::json& top,
                      const std::string& path, double default_theta) {
  RopeConfig r;
  r.theta = get_number(params, "rope_theta", path).value_or(default_theta);
  std::optional<std::string> type = get_string(params, "rope_type", path);
  if (!type) type = get_string(params, "type", path);
  r.type = type.value_or("default");
  static const std::set<std::string> kTypes = {"default", "linear",  "llama3",
                                               "yarn",    "dynamic", "proportional"};
  if (kTypes.count(r.type) == 0) {
    throw Unsupported(str_cat(path, ": rope type '", r.type,
                              "' is not supported (supported: default, linear, llama3, yarn, "
                              "dynamic, proportional)"));
  }
  r.partial_rotary_factor =
      get_number(params, "partial_rotary_factor", path)
          .value_or(get_number(top, "partial_rotary_factor", path).value_or(1));
  const int64_t max_pos = get_int(top, "max_position_embeddings", path, 0, INT64_MAX).value_or(0);
  r.original_max_position_embeddings =
      get_int(params, "original_max_position_embeddings", path, 0, INT64_MAX).value_or(max_pos);
  std::optional<double> factor = get_number(params, "factor", path);
  if (!factor && r.type == "yarn" && r.original_max_position_embeddings > 0) {
    factor = double(max_pos) / double(r.original_max_position_embeddings);
  }
  r.factor = factor.value_or(1);
  if (r.type != "default" && !(r.factor > 0)) {
    throw FormatError(str_cat(path, ": rope factor ", r.factor, " must be > 0"));
  }
  r.low_freq_factor = get_number(params, "low_freq_factor", path).value_or(1);
  r.high_freq_factor = get_number(params, "high_freq_factor", path).value_or(4);
  r.beta_fast = get_number(params, "beta_fast", path).value_or(32);
  r.beta_slow = get_number(params, "beta_slow", path).value_or(1);
  r.attention_factor = get_number(params, "attention_factor", path);
  r.mscale = get_number(params, "mscale", path);
  r.mscale_all_dim = get_number(params, "mscale_all_dim", path);
  r.truncate = get_bool(params, "truncate", path).value_or(true);
  return r;
}

void parse_ropes(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  const double top_theta = get_number(j, "rope_theta", path).value_or(10000);
  auto params = j.find("rope_parameters");
  if (params != j.end() && params->is_object() && !params->contains("rope_type") &&
      !params->contains("rope_theta")) {
    // Per layer type (gemma3): {"full_attention": {...}, "sliding_attention": {...}}.
    auto full = params->find("full_attention");
    if (full == params->end()) {
      throw FormatError(str_cat(path,
                                ": rope_parameters has neither rope_type nor a "
                                "'full_attention' entry"));
    }
    c.rope = parse_rope(*full, j, path, top_theta);
    auto sliding = params->find("sliding_attention");
    if (sliding != params->end()) c.rope_local = parse_rope(*sliding, j, path, top_theta);
    return;
  }
  if (params != j.end() && params->is_object()) {
    c.rope = parse_rope(*params, j, path, top_theta);
    return;
  }
  auto scaling = j.find("rope_scaling");
  c.rope =
      parse_rope(scaling != j.end() && scaling->is_object() ? *scaling : nlohmann::json::object(),
                 j, path, top_theta);
}

void parse_layer_types(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  c.sliding_window.assign(size_t(c.num_layers), 0);
  c.layer_kind.assign(size_t(c.num_layers), LayerKind::kAttention);
  auto types = j.find("layer_types");
  if (types == j.end() || types->is_null()) return;
  if (!types->is_array() || int(types->size()) != c.num_layers) {
    throw FormatError(str_cat(path, ": layer_types must list ", c.num_layers, " layer types, got ",
                              json_excerpt(*types)));
  }
  const int64_t window = get_int(j, "sliding_window", path, 0, config_json::kIntMax).value_or(0);
  for (int i = 0; i < c.num_layers; ++i) {
    const nlohmann::json& t = (*types)[size_t(i)];
    if (t == "full_attention") continue;
    if (t == "linear_attention") {
      c.layer_kind[size_t(i)] = LayerKind::kLinearAttention;
      continue;
    }
    if (t != "sliding_attention") {
      throw Unsupported(str_cat(path, ": layer type ", json_excerpt(t), " of layer ", i,
                                " is not supported (supported: full_attention, "
                                "sliding_attention, linear_attention)"));
    }
    if (window <= 0) {
      throw FormatError(
          str_cat(path, ": layer ", i, " is sliding_attention but sliding_window is not positive"));
    }
    c.sliding_window[size_t(i)] = int(window);
  }
}

std::vector<int32_t> token_ids(const nlohmann::json& j, const char* key, const std::string& path) {
  std::vector<int32_t> ids;
  if (!j.is_object()) throw FormatError(str_cat(path, ": expected a JSON object"));
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ids;
  // A token id is in [0, INT32_MAX]; anything else would wrap when stored.
  auto id_of = [&](const nlohmann::json& v) {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT32_MAX)) ||
        (!v.is_number_unsigned() && (v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX))) {
      throw FormatError(str_cat(path, ": field '", key, "' must hold token ids in [0, ", INT32_MAX,
                                "], got ", json_excerpt(*it)));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  };
  if (it->is_number_integer()) {
    ids.push_back(id_of(*it));
  } else if (it->is_array()) {
    for (const auto& v : *it) ids.push_back(id_of(v));
  } else {
    throw FormatError(str_cat(path, ": field '", key, "' is ", json_excerpt(*it),
                              ", expected an integer or a list of integers"));
  }
  return ids;
}

// Per-layer attention geometry from the model-wide sizes, for layers the family left unset.
void finish_layers(ModelConfig& c) {
  if (c.attention.empty()) c.attention.resize(size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    AttentionLayerConfig& a = c.attention[size_t(l)];
    if (a.num_heads == 0) a.num_heads = c.num_heads;
    if (a.num_kv_heads == 0) a.num_kv_heads = c.num_kv_heads;
    if (a.head_dim == 0) a.head_dim = c.head_dim;
    a.sliding_window = c.sliding_window[size_t(l)];
  }
}

void validate_layers(const ModelConfig& c, const std::string& path) {
  if (c.attention.size() != size_t(c.num_layers) || c.layer_kind.size() != size_t(c.num_layers)) {
    throw FormatError(
        str_cat(path, ": per-layer configuration does not cover ", c.num_layers, " layers"));
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerKind kind = c.layer_kind[size_t(l)];
    if (kind == LayerKind::kLinearAttention && c.linear.num_value_heads == 0) {
      throw Unsupported(str_cat(path, ": layer ", l, " is linear_attention, which model_type '",
                                c.model_type, "' does not have"));
    }
    if (kind != LayerKind::kAttention) continue;
    const AttentionLayerConfig& a = c.attention[size_t(l)];
    if (a.num_heads <= 0 || a.num_kv_heads <= 0 || a.head_dim <= 0 ||
        a.num_heads % a.num_kv_heads != 0) {
      throw FormatError(str_cat(path, ": layer ", l, " has ", a.num_heads, " query heads, ",
                                a.num_kv_heads, " KV heads of head_dim ", a.head_dim,
                                " (query heads must be a positive multiple of KV heads)"));
    }
    if (a.kv_source >= l ||
        (a.kv_source >= 0 && c.layer_kind[size_t(a.kv_source)] != LayerKind::kAttention)) {
      throw FormatError(str_cat(path, ": layer ", l, " reads the KV cache of layer ", a.kv_source,
                                ", which must be an earlier attention layer"));
    }
  }
}

void validate(const ModelConfig& c, const std::string& path) {
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) throw FormatError(str_cat(path, ": ", name, " is ", v, ", expected > 0"));
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_layers);
  positive("num_attention_heads", c.num_heads);
  positive("num_key_value_heads", c.num_kv_heads);
  positive("head_dim", c.head_dim);
  if (c.num_experts == 0) positive("intermediate_size", c.intermediate_size);
  if (c.num_heads % c.num_kv_heads != 0) {
    throw FormatError(str_cat(path, ": num_attention_heads ", c.num_heads,
                              " is not a multiple of num_key_value_heads ", c.num_kv_heads));
  }
  validate_layers(c, path);
  for (const RopeConfig* r : {&c.rope, c.rope_local ? &*c.rope_local : nullptr}) {
    if (r == nullptr || r->type == "proportional") continue;
    const int rotary_dim = int(c.head_dim * r->partial_rotary_factor);
    if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > c.head_dim) {
      throw FormatError(str_cat(path, ": partial_rotary_factor ", r->partial_rotary_factor,
                                " gives rotary dim ", rotary_dim, " for head_dim ", c.head_dim,
                                " (must be even, in 2..head_dim)"));
    }
  }
}

}  // namespace

const char* layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::kAttention:
      return "attention";
    case LayerKind::kLinearAttention:
      return "linear_attention";
    case LayerKind::kMla:
      return "mla";
  }
  return "?";
}

std::string supported_model_types() {
  std::string names;
  for (const Family& f : kFamilies) names += str_cat(names.empty() ? "" : ", ", f.model_type);
  return names;
}

ModelConfig parse_model_config(const nlohmann::json& top, const std::string& path) {
  if (!top.is_object()) throw FormatError(str_cat(path, ": expected a JSON object"));
  // Multimodal checkpoints (qwen3_5, gemma4) wrap the language model in text_config; its
  // weights sit under model.language_model.
  const nlohmann::json* text = &top;
  nlohmann::json unwrapped;
  if (auto it = top.find("text_config"); it != top.end() && it->is_object()) {
    unwrapped = *it;
    for (const char* key : {"tie_word_embeddings", "eos_token_id", "bos_token_id"}) {
      if (!unwrapped.contains(key) && top.contains(key)) unwrapped[key] = top[key];
    }
    text = &unwrapped;
  }
  const nlohmann::json& j = *text;
  const std::optional<std::string> model_type = get_string(j, "model_type", path);
  if (!model_type) throw FormatError(str_cat(path, ": required field 'model_type' is missing"));
  const Family* family = nullptr;
  for (const Family& f : kFamilies) {
    if (*model_type == f.model_type) family = &f;
  }
  if (family == nullptr) {
    std::string arch;
    auto archs = j.find("architectures");
    if (archs != j.end() && archs->is_array() && !archs->empty())
      arch = " (" + json_excerpt(archs->front()) + ")";
    throw Unsupported(
        str_cat(path, ": architecture '", *model_type, "'", arch,
                " is not supported; supported model_type values: ", supported_model_types()));
  }

  ModelConfig c;
  c.model_type = *model_type;
  if (text != &top) c.weight_prefix = "model.language_model.";
  using config_json::kIntMax;
  c.vocab_size = int(require_int(j, "vocab_size", path, 1, kIntMax));
  c.hidden_size = int(require_int(j, "hidden_size", path, 1, kIntMax));
  c.intermediate_size = int(get_int(j, "intermediate_size", path, 0, kIntMax).value_or(0));
  c.num_layers = int(require_int(j, "num_hidden_layers", path, 1, kIntMax));
  c.num_heads = int(require_int(j, "num_attention_heads", path, 1, kIntMax));
  c.num_kv_heads = int(get_int(j, "num_key_value_heads", path, 1, kIntMax).value_or(c.num_heads));
  c.head_dim = int(get_int(j, "head_dim", path, 1, kIntMax).value_or(c.hidden_size / c.num_heads));
  c.max_position_embeddings = get_int(j, "max_position_embeddings", path, 0, INT64_MAX).value_or(0);
  c.rms_norm_eps = get_number(j, "rms_norm_eps", path).value_or(1e-6);
  c.activation = parse_activation(j, path);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", path).value_or(false);
  c.attention_scale = c.head_dim > 0 ? float(1.0 / std::sqrt(double(c.head_dim))) : 0;
  parse_ropes(j, path, c);
  if (c.num_layers > 0) parse_layer_types(j, path, c);
  c.eos_token_ids = token_ids(j, "eos_token_id", path);
  const std::vector<int32_t> bos = token_ids(j, "bos_token_id", path);
  if (!bos.empty()) c.bos_token_id = bos.front();

  family->configure(j, path, c);
  finish_layers(c);
  validate(c, path);
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::exists(path)) {
    throw IoError(str_cat("model directory ", dir, " has no config.json"));
  }
  ModelConfig c = parse_model_config(read_json_file(path), path);
  const std::string gen_path = (std::filesystem::path(dir) / "generation_config.json").string();
  if (std::filesystem::exists(gen_path)) {
    for (int32_t id : token_ids(read_json_file(gen_path), "eos_token_id", gen_path)) {
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end()) {
        c.eos_token_ids.push_back(id);
      }
    }
  }
  return c;
}

}  // namespace turbokv
