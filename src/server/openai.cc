// OpenAI request parsing with typed 400 errors, and the response/usage JSON (see openai.h).
#include "server/openai.h"

#include <algorithm>
#include <charconv>
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

ErrorReply error_reply(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const ApiError& e) {
    return {e.status, e.what(), e.type, e.param, e.code};
  } catch (const Overloaded& e) {
    return {429, e.what(), "server_busy", std::nullopt, "overloaded"};
  } catch (const InvalidArgument& e) {
    std::optional<std::string> param;
    if (!e.param().empty()) param = e.param();
    return {400, e.what(), "invalid_request_error", param, "invalid_value"};
  } catch (const std::exception& e) {
    return {500, e.what(), "server_error", std::nullopt, std::nullopt};
  } catch (...) {
    return {500, "internal error", "server_error", std::nullopt, std::nullopt};
  }
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

// An integer field within [lo, hi]: a value out of range is a 400, never a wrapped number.
std::optional<int64_t> get_int(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    throw invalid(key, str_cat("'", key, "' must be an integer, got ", json_excerpt(*v)));
  }
  const bool too_big = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX);
  if (too_big || v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
    throw invalid(
        key, str_cat("'", key, "'=", json_excerpt(*v), " is out of range [", lo, ", ", hi, "]"));
  }
  return v->get<int64_t>();
}

// A seed: any 64-bit integer, signed or unsigned (as bits).
std::optional<uint64_t> get_seed(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    throw invalid(key, str_cat("'", key, "' must be an integer, got ", json_excerpt(*v)));
  }
  return v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
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
    if (auto g = get_int(body, "kv_group_size", 1, INT32_MAX)) {
      kv.kv_group_size = static_cast<int>(*g);
    }
    if (auto s = get_int(body, "quantized_kv_start", 0, INT64_MAX)) kv.quantized_kv_start = *s;
    if (auto s = get_seed(body, "kv_seed")) kv.seed = *s;
    if (auto b = get_bool(body, "kv_norm_correction")) kv.norm_correction = *b;
    if (auto b = get_bool(body, "kv_unbiased_norm")) kv.kv_unbiased_norm = *b;
    if (auto b = get_bool(body, "kv_quantize_last_layer")) kv.last_layer_dense = !*b;
    if (auto s = get_string(body, "kv_centering")) kv.kv_centering = *s;
    if (auto n = get_int(body, "kv_sink_tokens", 0, 65536)) kv.kv_sink_tokens = int(*n);
    if (auto n = get_int(body, "kv_recent_tokens", 0, 1024)) kv.kv_recent_tokens = int(*n);
    if (auto s = get_string(body, "kv_allocation")) kv.kv_allocation = *s;
    if (auto b = get_number(body, "kv_budget")) kv.kv_budget = *b;
    if (auto s = get_string(body, "kv_layer_bits")) kv.kv_layer_bits = *s;
    if (auto b = get_bool(body, "kv_hadamard")) kv.kv_hadamard = *b;
    // Validated here so that a bad combination is this request's 400, and a lever asked for
    // with a dense cache is refused rather than ignored.
    if (resolve_kv_options(kv).scheme == KVScheme::kDense) {
      for (const char* key : kv_lever_names()) {
        if (field(body, key)) {
          throw InvalidArgument(
              str_cat("'", key, "' applies to a quantized KV cache; this request's is dense (",
                      "set kv_bits)"),
              key);
        }
      }
    }
  } catch (const InvalidArgument& e) {
    throw invalid(e.param().empty() ? "kv_bits" : e.param(), e.what());
  }
  return kv;  // resolved again when the request is submitted
}

// The token-id -> bias map of logit_bias: {"50256": -100, ...}.
std::vector<std::pair<int32_t, double>> parse_logit_bias(const json& bias) {
  if (!bias.is_object()) {
    throw invalid("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
  }
  std::vector<std::pair<int32_t, double>> out;
  for (const auto& [key, value] : bias.items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX) {
      throw invalid("logit_bias",
                    str_cat("'logit_bias' key '", json_excerpt(json(key)), "' is not a token id"));
    }
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
      throw invalid("logit_bias", str_cat("'logit_bias' of token ", id, " must be a number in ",
                                          "[-100, 100], got ", json_excerpt(value)));
    }
    out.emplace_back(static_cast<int32_t>(id), value.get<double>());
  }
  return out;
}

// Fields shared by both endpoints.
void parse_common(const json& body, const RequestLimits& limits, const KVOptions& server_kv,
                  ApiRequest* r) {
  if (auto model = field(body, "model"); model && !model->is_string()) {
    throw invalid("model", "'model' must be a string");
  }
  if (auto user = field(body, "user"); user && !user->is_string()) {
    throw invalid("user", "'user' must be a string");
  }
  const char* max_tokens_name = "max_completion_tokens";
  std::optional<int64_t> max_tokens = get_int(body, max_tokens_name, 1, limits.max_tokens);
  if (!max_tokens) {
    max_tokens_name = "max_tokens";
    max_tokens = get_int(body, max_tokens_name, 1, limits.max_tokens);
  }
  GenerateOptions& o = r->options;
  o.max_tokens = static_cast<int>(max_tokens.value_or(limits.max_tokens));

  SamplingOptions& s = o.sampling;
  s.temperature = get_number(body, "temperature").value_or(1.0);  // OpenAI's default
  s.top_p = get_number(body, "top_p").value_or(1.0);
  s.top_k = static_cast<int>(get_int(body, "top_k", 0, INT32_MAX).value_or(0));
  s.min_p = get_number(body, "min_p").value_or(0.0);
  s.repetition_penalty = get_number(body, "repetition_penalty").value_or(1.0);
  s.presence_penalty = get_number(body, "presence_penalty").value_or(0.0);
  s.frequency_penalty = get_number(body, "frequency_penalty").value_or(0.0);
  if (auto seed = get_seed(body, "seed")) s.seed = *seed;
  const std::pair<const char*, bool> checks[] = {
      {"temperature", s.temperature >= 0 && s.temperature <= 2},
      {"top_p", s.top_p > 0 && s.top_p <= 1},
      {"min_p", s.min_p >= 0 && s.min_p <= 1},
      {"repetition_penalty", s.repetition_penalty > 0},
      {"presence_penalty", s.presence_penalty >= -2 && s.presence_penalty <= 2},
      {"frequency_penalty", s.frequency_penalty >= -2 && s.frequency_penalty <= 2}};
  for (const auto& [name, ok] : checks) {
    if (!ok) {
      throw invalid(name, str_cat("'", name, "'=", json_excerpt(*field(body, name)),
                                  " is out of range (temperature [0, 2], top_p (0, 1], min_p "
                                  "[0, 1], repetition_penalty > 0, presence_penalty and "
                                  "frequency_penalty [-2, 2])"));
    }
  }
  if (const json* bias = field(body, "logit_bias")) s.logit_bias = parse_logit_bias(*bias);
  if (auto n = get_int(body, "n", INT64_MIN, INT64_MAX); n && *n != 1) {
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
    for (const auto& [key, value] : so->items()) {
      if (key != "include_usage") {
        throw ApiError(400, str_cat("'stream_options.", key, "' is not supported"),
                       "invalid_request_error", str_cat("stream_options.", key),
                       "unsupported_parameter");
      }
    }
    r->include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  o.kv = parse_kv(body, server_kv);
  for (const char* key : kv_field_names()) {
    r->kv_given = r->kv_given || body.contains(key);
  }
  if (auto slot = get_int(body, "id_slot", -1, INT32_MAX); slot && *slot >= 0) r->slot = slot;
}

// Fields a request may carry: those parsed above and the endpoint's own. Anything else is a
// 400 naming it, so that no option is silently ignored.
void reject_unknown_fields(const json& body, bool chat) {
  static const char* const kCommon[] = {"model",
                                        "max_tokens",
                                        "temperature",
                                        "top_p",
                                        "top_k",
                                        "min_p",
                                        "repetition_penalty",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "logit_bias",
                                        "seed",
                                        "n",
                                        "stop",
                                        "stream",
                                        "stream_options",
                                        "user",
                                        "id_slot"};
  static const char* const kChat[] = {"messages",     "max_completion_tokens", "logprobs",
                                      "top_logprobs", "response_format",       "tools",
                                      "tool_choice"};
  static const char* const kCompletion[] = {"prompt", "logprobs", "echo", "best_of", "suffix"};
  for (const auto& [key, value] : body.items()) {
    auto in = [&key = key](const auto& names) {
      return std::any_of(std::begin(names), std::end(names),
                         [&key](const char* n) { return key == n; });
    };
    if (!in(kCommon) && !in(kv_field_names()) && !(chat ? in(kChat) : in(kCompletion))) {
      const std::string name = key.size() > 64 ? key.substr(0, 64) + "..." : key;
      throw ApiError(400,
                     str_cat("'", name, "' is not supported by this server's ",
                             chat ? "/v1/chat/completions" : "/v1/completions"),
                     "invalid_request_error", name, "unsupported_parameter");
    }
  }
  // Accepted only with the value that means "nothing to do".
  auto unsupported = [](const std::string& name, const std::string& why) {
    return ApiError(400, str_cat("'", name, "' is not supported: ", why), "invalid_request_error",
                    name, "unsupported_parameter");
  };
  if (chat) {
    if (const json* f = field(body, "response_format");
        f && !(f->is_object() && f->size() == 1 && f->value("type", "") == "text")) {
      throw unsupported("response_format", "only {\"type\": \"text\"} (no JSON modes)");
    }
    if (const json* t = field(body, "tools"); t && !(t->is_array() && t->empty())) {
      throw unsupported("tools", "this server does not call tools");
    }
    if (const json* t = field(body, "tool_choice"); t && *t != "none") {
      throw unsupported("tool_choice", "this server does not call tools (only \"none\")");
    }
  } else {
    if (const json* e = field(body, "echo"); e && *e != false) {
      throw unsupported("echo", "the prompt is not echoed (only false)");
    }
    if (const json* b = field(body, "best_of"); b && *b != 1) {
      throw unsupported("best_of", "one completion per request (only 1)");
    }
    if (const json* x = field(body, "suffix"); x && *x != "") {
      throw unsupported("suffix", "no insertion after a suffix (only \"\")");
    }
  }
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
  reject_unknown_fields(body, /*chat=*/true);
  parse_common(body, limits, server_kv, &r);
  r.options.logprobs = get_bool(body, "logprobs").value_or(false);
  if (auto top = get_int(body, "top_logprobs", 0, 20)) {
    if (!r.options.logprobs) {
      throw invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    r.options.top_logprobs = static_cast<int>(*top);
  }
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
  reject_unknown_fields(body, /*chat=*/false);
  parse_common(body, limits, server_kv, &r);
  if (auto n = get_int(body, "logprobs", 0, 5)) {  // completions: how many top tokens
    r.options.logprobs = true;
    r.options.top_logprobs = static_cast<int>(*n);
  }
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
