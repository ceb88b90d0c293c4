// OpenAI request parsing with typed 400 errors, and the response/usage JSON (see openai.h).
#include "server/openai.h"

#include <cmath>

#include "core/text_file.h"
#include "kv/kv_resolve.h"

namespace turbokv::server {

using nlohmann::json;

nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::optional<std::string>& param,
                          const std::optional<std::string>& code) {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (param) e["param"] = *param;
  if (code) e["code"] = *code;
  return {{"error", e}};
}

namespace {

ApiError invalid(const std::string& param, const std::string& message) {
  return ApiError(400, message, "invalid_request_error", param, "invalid_value");
}

const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// The field as a T when present and not null; a 400 naming the field when it has another type.
template <typename T>
std::optional<T> get_typed(const json& body, const char* key, bool (json::*has_type)() const,
                           const char* expected) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!(v->*has_type)()) {
    throw invalid(key, str_cat("'", key, "' must be ", expected, ", got ", json_excerpt(*v)));
  }
  return v->get<T>();
}

std::optional<int64_t> get_int(const json& body, const char* key) {
  return get_typed<int64_t>(body, key, &json::is_number_integer, "an integer");
}
std::optional<double> get_number(const json& body, const char* key) {
  return get_typed<double>(body, key, &json::is_number, "a number");
}
std::optional<bool> get_bool(const json& body, const char* key) {
  return get_typed<bool>(body, key, &json::is_boolean, "true or false");
}
std::optional<std::string> get_string(const json& body, const char* key) {
  return get_typed<std::string>(body, key, &json::is_string, "a string");
}

// A bit width as a number or a numeric string ("3.5").
std::optional<double> get_bits(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (v->is_number()) return v->get<double>();
  if (v->is_string()) return parse_kv_bits(v->get<std::string>(), key);
  throw invalid(key, str_cat("'", key, "' must be a number, got ", json_excerpt(*v)));
}

KVOptions parse_kv(const json& body, const KVOptions& server_kv) {
  KVOptions kv = server_kv;
  try {
    if (body.contains("kv_bits")) kv.kv_bits = get_bits(body, "kv_bits");
    if (auto s = get_string(body, "kv_quant_scheme")) kv.kv_quant_scheme = *s;
    if (auto b = get_bits(body, "kv_key_bits")) kv.kv_key_bits = b;
    if (auto b = get_bits(body, "kv_value_bits")) kv.kv_value_bits = b;
    if (auto g = get_int(body, "kv_group_size")) kv.kv_group_size = static_cast<int>(*g);
    if (auto s = get_int(body, "quantized_kv_start")) kv.quantized_kv_start = *s;
  } catch (const InvalidArgument& e) {
    throw invalid(e.param().empty() ? "kv_bits" : e.param(), e.what());
  }
  return kv;  // resolved (and validated) once, when the request is submitted
}

// Fields shared by both endpoints.
void parse_common(const json& body, const RequestLimits& limits, const KVOptions& server_kv,
                  ApiRequest* r) {
  if (auto model = field(body, "model"); model && !model->is_string()) {
    throw invalid("model", "'model' must be a string");
  }
  std::optional<int64_t> max_tokens = get_int(body, "max_completion_tokens");
  const char* max_tokens_name = "max_completion_tokens";
  if (!max_tokens) {
    max_tokens = get_int(body, "max_tokens");
    max_tokens_name = "max_tokens";
  }
  if (max_tokens && (*max_tokens < 1 || *max_tokens > limits.max_tokens)) {
    throw invalid(max_tokens_name, str_cat("'", max_tokens_name, "'=", *max_tokens,
                                           " must be in [1, ", limits.max_tokens, "]"));
  }
  GenerateOptions& o = r->options;
  o.max_tokens = static_cast<int>(max_tokens.value_or(limits.max_tokens));

  SamplingOptions& s = o.sampling;
  s.temperature = get_number(body, "temperature").value_or(1.0);  // OpenAI's default
  s.top_p = get_number(body, "top_p").value_or(1.0);
  s.top_k = static_cast<int>(get_int(body, "top_k").value_or(0));
  s.min_p = get_number(body, "min_p").value_or(0.0);
  s.repetition_penalty = get_number(body, "repetition_penalty").value_or(1.0);
  if (auto seed = get_int(body, "seed")) s.seed = static_cast<uint64_t>(*seed);
  const std::pair<const char*, bool> checks[] = {
      {"temperature", s.temperature >= 0 && s.temperature <= 2},
      {"top_p", s.top_p > 0 && s.top_p <= 1},
      {"top_k", s.top_k >= 0},
      {"min_p", s.min_p >= 0 && s.min_p <= 1},
      {"repetition_penalty", s.repetition_penalty > 0}};
  for (const auto& [name, ok] : checks) {
    if (!ok) {
      throw invalid(name, str_cat("'", name, "'=", json_excerpt(*field(body, name)),
                                  " is out of range (temperature [0, 2], top_p (0, 1], top_k "
                                  ">= 0, min_p [0, 1], repetition_penalty > 0)"));
    }
  }
  if (auto n = get_int(body, "n"); n && *n != 1) {
    throw invalid("n", str_cat("'n'=", *n, " is not supported: only n=1"));
  }

  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      o.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array() && stop->size() <= 4) {
      for (const auto& s : *stop) {
        if (!s.is_string()) throw invalid("stop", "'stop' must be a string or up to 4 strings");
        o.stop.push_back(s.get<std::string>());
      }
    } else {
      throw invalid("stop", "'stop' must be a string or an array of up to 4 strings");
    }
  }
  r->stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw invalid("stream_options", "'stream_options' must be an object");
    r->include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  o.kv = parse_kv(body, server_kv);
  for (const char* key : {"kv_bits", "kv_quant_scheme", "kv_key_bits", "kv_value_bits",
                          "kv_group_size", "quantized_kv_start"}) {
    r->kv_given = r->kv_given || body.contains(key);
  }
  if (auto slot = get_int(body, "id_slot"); slot && *slot >= 0) r->slot = slot;
}

std::string message_content(const json& content, size_t index) {
  const std::string param = str_cat("messages[", index, "].content");
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {  // [{"type": "text", "text": ...}]
    std::string text;
    for (const auto& part : content) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        throw invalid(param, str_cat("'", param, "' parts must be {\"type\": \"text\", ",
                                     "\"text\": string}: only text is supported"));
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  throw invalid(param, str_cat("'", param, "' must be a string or an array of text parts"));
}

void require_object(const json& body) {
  if (!body.is_object()) {
    throw ApiError(400, "the request body must be a JSON object", "invalid_request_error",
                   std::nullopt, "invalid_value");
  }
}

}  // namespace

json parse_request_body(const std::string& text) {
  if (const size_t deep = find_json_depth_excess(text); deep != std::string_view::npos) {
    throw ApiError(400,
                   str_cat("the request body nests arrays/objects deeper than ", kMaxJsonDepth,
                           " levels (at byte ", deep, ")"),
                   "invalid_request_error", std::nullopt, "invalid_json");
  }
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    throw ApiError(400, "the request body is not valid JSON", "invalid_request_error", std::nullopt,
                   "invalid_json");
  }
  return body;
}

ApiRequest parse_chat_request(const json& body, const RequestLimits& limits,
                              const KVOptions& server_kv) {
  require_object(body);
  ApiRequest r;
  r.chat = true;
  const json* messages = field(body, "messages");
  if (!messages || !messages->is_array() || messages->empty()) {
    throw invalid("messages", "'messages' must be a non-empty array of {role, content}");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      throw invalid(str_cat("messages[", i, "]"),
                    str_cat("'messages[", i, "]' must be an object with a string 'role'"));
    }
    r.messages.push_back({m["role"].get<std::string>(),
                          message_content(m.contains("content") ? m["content"] : json(), i)});
  }
  parse_common(body, limits, server_kv, &r);
  return r;
}

ApiRequest parse_completion_request(const json& body, const RequestLimits& limits,
                                    const KVOptions& server_kv) {
  require_object(body);
  ApiRequest r;
  r.chat = false;
  const json* prompt = field(body, "prompt");
  if (prompt && prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    prompt = &(*prompt)[0];
  }
  if (!prompt || !prompt->is_string()) {
    throw invalid("prompt", "'prompt' must be a string (or an array of one string)");
  }
  r.prompt = prompt->get<std::string>();
  parse_common(body, limits, server_kv, &r);
  return r;
}

nlohmann::json usage_json(const GenerationStats& stats) {
  return {{"prompt_tokens", stats.prompt_tokens},
          {"completion_tokens", stats.generated_tokens},
          {"total_tokens", stats.prompt_tokens + stats.generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", stats.prompt_cached_tokens}}},
          {"prompt_tps", stats.prompt_tps},
          {"generation_tps", stats.generation_tps},
          {"kv_bytes", stats.kv_bytes},
          {"kv_bytes_dense", stats.kv_bytes_dense},
          {"kv_scheme", kv_scheme_name(stats.kv.scheme)}};
}

}  // namespace turbokv::server
