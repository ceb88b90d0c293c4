// OpenAI schema: parsing and validating /v1/chat/completions and /v1/completions bodies into
// engine requests, and the JSON of responses, stream chunks and errors.
#pragma once

#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "turbokv/engine.h"

namespace turbokv::server {

// An error with its HTTP status, sent as {"error": {"message", "type", "param", "code"}}.
class ApiError : public Error {
 public:
  ApiError(int status, const std::string& message, std::string type = "invalid_request_error",
           std::optional<std::string> param = std::nullopt,
           std::optional<std::string> code = std::nullopt)
      : Error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;
  std::optional<std::string> param, code;
};

nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::optional<std::string>& param,
                          const std::optional<std::string>& code);

// What an exception becomes in a response: ApiError as it says, Overloaded 429 (server_busy),
// InvalidArgument 400 (invalid_request_error, its param), any other std::exception 500
// (server_error, its message), anything else 500 "internal error". The same for a plain reply
// and for the error event of a stream whose status was already sent.
struct ErrorReply {
  int status = 500;
  std::string message, type;
  std::optional<std::string> param, code;
};
ErrorReply error_reply(const std::exception_ptr& error);

struct RequestLimits {
  int max_tokens = 4096;  // largest max_tokens a request may ask for (also the default)
};

struct ApiRequest {
  bool chat = true;
  std::vector<ChatMessage> messages;  // chat
  std::string prompt;                 // completions
  GenerateOptions options;
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  std::optional<int64_t> slot;  // id_slot: run on that slot's session (llama.cpp's name)
  bool kv_given = false;        // the body has kv_* fields (else a slot keeps its settings)
};

// The JSON of a request body. Throws ApiError 400 (code invalid_json) for malformed JSON and for
// arrays/objects nested deeper than kMaxJsonDepth (core/text_file.h).
nlohmann::json parse_request_body(const std::string& body);

// Throw ApiError (400, naming the parameter) for malformed fields. server_kv is the server's
// default, which the request's kv_* fields override field by field (kv_bits: null = dense).
ApiRequest parse_chat_request(const nlohmann::json& body, const RequestLimits& limits,
                              const KVOptions& server_kv);
ApiRequest parse_completion_request(const nlohmann::json& body, const RequestLimits& limits,
                                    const KVOptions& server_kv);

// The usage object, with turbokv's KV statistics as extra fields.
nlohmann::json usage_json(const GenerationStats& stats);

}  // namespace turbokv::server
