// OpenAI request parsing: accepted shapes, defaults, and a 400 naming the parameter for each
// malformed field.
#include "server/openai.h"

#include <gtest/gtest.h>

#include "kv/kv_resolve.h"

namespace turbokv::server {
namespace {

using nlohmann::json;

json chat(json extra = json::object()) {
  json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  body.update(extra);
  return body;
}

// The param named by the ApiError that parsing body throws ("" if none is thrown).
std::string bad_param(const json& body, const KVOptions& kv = {}) {
  try {
    parse_chat_request(body, {}, kv);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param.value_or("<none>");
  }
  return "";
}

TEST(OpenAIRequest, ParsesChatFields) {
  const auto r = parse_chat_request(
      chat({{"max_tokens", 7},
            {"temperature", 0},
            {"top_p", 0.5},
            {"seed", 3},
            {"stop", {"a", "b"}},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}},
            {"messages",
             {{{"role", "system"}, {"content", "s"}},
              {{"role", "user"},
               {"content",
                {{{"type", "text"}, {"text", "x"}}, {{"type", "text"}, {"text", "y"}}}}}}}}),
      {}, {});
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "xy");
  EXPECT_EQ(r.options.max_tokens, 7);
  EXPECT_EQ(r.options.sampling.temperature, 0);
  EXPECT_EQ(r.options.sampling.top_p, 0.5);
  EXPECT_EQ(r.options.sampling.seed, 3u);
  EXPECT_EQ(r.options.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAIRequest, DefaultsFollowOpenAIAndTheServerLimits) {
  RequestLimits limits;
  limits.max_tokens = 99;
  const auto r = parse_chat_request(chat(), limits, {});
  EXPECT_EQ(r.options.max_tokens, 99);
  EXPECT_EQ(r.options.sampling.temperature, 1.0);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(parse_chat_request(chat({{"max_completion_tokens", 5}}), limits, {}).options.max_tokens,
            5);
}

TEST(OpenAIRequest, KVFieldsOverrideTheServerDefault) {
  KVOptions server_kv;
  server_kv.kv_bits = 3.5;
  auto kept = parse_chat_request(chat(), {}, server_kv).options.kv;
  EXPECT_EQ(kept->kv_bits, 3.5);
  auto dense = parse_chat_request(chat({{"kv_bits", nullptr}}), {}, server_kv).options.kv;
  EXPECT_FALSE(dense->kv_bits.has_value());
  auto tq = parse_chat_request(chat({{"kv_bits", "4"}, {"kv_quant_scheme", "turboquant"}}), {}, {})
                .options.kv;
  EXPECT_EQ(resolve_kv_options(*tq).scheme, KVScheme::kTurboQuant);
}

TEST(OpenAIRequest, KVLeversReachTheOptions) {
  auto kv = *parse_chat_request(chat({{"kv_bits", 3.5},
                                      {"kv_seed", 7},
                                      {"kv_unbiased_norm", true},
                                      {"kv_quantize_last_layer", true},
                                      {"kv_centering", "keys"},
                                      {"kv_sink_tokens", 4},
                                      {"kv_recent_tokens", 3},
                                      {"kv_allocation", "none"},
                                      {"kv_layer_bits", "0:4/4"}}),
                                {}, {})
                 .options.kv;
  const ResolvedKV r = resolve_kv_options(kv);
  EXPECT_EQ(r.seed, 7u);
  EXPECT_TRUE(r.unbiased_norm);
  EXPECT_FALSE(r.last_layer_dense);
  EXPECT_TRUE(r.center_keys);
  EXPECT_FALSE(r.center_values);
  EXPECT_EQ(r.sink_tokens, 4);
  EXPECT_EQ(r.recent_tokens, 3);
  EXPECT_EQ(r.allocation, KVAllocation::kNone);
  ASSERT_EQ(r.layer_bits.size(), 1u);
  EXPECT_EQ(r.layer_bits[0].key_bits, 4);
  auto uniform =
      *parse_chat_request(
           chat({{"kv_bits", 4}, {"kv_hadamard", true}, {"kv_norm_correction", false}}), {}, {})
           .options.kv;
  EXPECT_TRUE(resolve_kv_options(uniform).hadamard);
  EXPECT_FALSE(uniform.norm_correction);
  // A server default lever stays when a request only changes the bits.
  KVOptions server_kv;
  server_kv.kv_bits = 3.5;
  server_kv.kv_centering = "both";
  auto inherited = *parse_chat_request(chat({{"kv_bits", 2.5}}), {}, server_kv).options.kv;
  EXPECT_TRUE(resolve_kv_options(inherited).center_values);
  // ... and a dense request of that server does not trip over it.
  EXPECT_EQ(bad_param(chat({{"kv_bits", nullptr}}), server_kv), "");
}

TEST(OpenAIRequest, BadKVLeversAreNamed400s) {
  EXPECT_EQ(bad_param(chat({{"kv_centering", "keys"}})), "kv_centering");  // dense cache
  EXPECT_EQ(bad_param(chat({{"kv_bits", 3.5}, {"kv_centering", "sideways"}})), "kv_centering");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 3.5}, {"kv_centering", 1}})), "kv_centering");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 3.5}, {"kv_sink_tokens", -1}})), "kv_sink_tokens");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 3.5}, {"kv_recent_tokens", 1025}})), "kv_recent_tokens");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 3.5}, {"kv_allocation", "most"}})), "kv_allocation");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 3.5}, {"kv_budget", 3.5}})), "kv_budget");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 3.5}, {"kv_layer_bits", "x"}})), "kv_layer_bits");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 3.5}, {"kv_hadamard", true}})), "kv_hadamard");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 4}, {"kv_sink_tokens", 4}})), "kv_sink_tokens");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 3.5}, {"kv_unbiased_norm", "yes"}})), "kv_unbiased_norm");
  EXPECT_EQ(bad_param(chat(
                {{"kv_bits", 3.5}, {"kv_unbiased_norm", true}, {"kv_norm_correction", false}})),
            "kv_unbiased_norm");
  EXPECT_EQ(bad_param(chat({{"kv_seed", -1.5}})), "kv_seed");
  EXPECT_EQ(bad_param(chat({{"kv_quantize_last_layer", true}})), "kv_quantize_last_layer");
}

TEST(OpenAIRequest, MalformedFieldsName400Params) {
  EXPECT_EQ(bad_param(chat({{"max_tokens", "ten"}})), "max_tokens");
  EXPECT_EQ(bad_param(chat({{"max_tokens", 0}})), "max_tokens");
  EXPECT_EQ(bad_param(chat({{"max_tokens", 1.5}})), "max_tokens");
  EXPECT_EQ(bad_param(chat({{"max_tokens", 100000}})), "max_tokens");
  EXPECT_EQ(bad_param(chat({{"temperature", "hot"}})), "temperature");
  EXPECT_EQ(bad_param(chat({{"temperature", 3}})), "temperature");
  EXPECT_EQ(bad_param(chat({{"top_p", 0}})), "top_p");
  EXPECT_EQ(bad_param(chat({{"stream", "yes"}})), "stream");
  EXPECT_EQ(bad_param(chat({{"stop", 5}})), "stop");
  EXPECT_EQ(bad_param(chat({{"n", 2}})), "n");
  EXPECT_EQ(bad_param(chat({{"model", 5}})), "model");
  EXPECT_EQ(bad_param(chat({{"messages", "hi"}})), "messages");
  EXPECT_EQ(bad_param(chat({{"messages", json::array()}})), "messages");
  EXPECT_EQ(bad_param(chat({{"messages", {{{"content", "x"}}}}})), "messages[0]");
  EXPECT_EQ(bad_param(chat({{"messages", {{{"role", "user"}, {"content", 5}}}}})),
            "messages[0].content");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 9}})), "kv_bits");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 0.3}})), "kv_bits");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 2.25}})), "kv_bits");
  EXPECT_EQ(bad_param(chat({{"kv_bits", "abc"}})), "kv_bits");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 4}, {"kv_quant_scheme", "foo"}})), "kv_quant_scheme");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 4}, {"kv_group_size", 48}})), "kv_group_size");
  EXPECT_EQ(bad_param(chat({{"kv_key_bits", 2.25}})), "kv_key_bits");
  EXPECT_EQ(bad_param(json::array()), "<none>");
}

std::string nested(size_t depth) {
  return std::string(depth, '[') + "1" + std::string(depth, ']');
}

TEST(OpenAIRequest, DeeplyNestedTypedFieldsAre400s) {
  // Within the body's depth limit, and far past it (a value built by nlohmann's own parser):
  // the error names the field and quotes a short excerpt.
  for (size_t depth : {size_t(200), size_t(100000)}) {
    for (const char* key :
         {"max_tokens", "temperature", "stream", "kv_bits", "seed", "top_k", "stop", "model"}) {
      json body = chat();
      body[key] = json::parse(nested(depth));  // moved in: copying it would recurse 100000 deep
      try {
        parse_chat_request(body, {}, {});
        ADD_FAILURE() << key << ": no error";
      } catch (const ApiError& e) {
        EXPECT_EQ(e.param.value_or(""), key);
        EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
      }
    }
  }
}

TEST(OpenAIRequest, BodyParsingRefusesDeepNestingAndBadJson) {
  const std::string deep = R"({"messages": [], "max_tokens": )" + nested(100000) + "}";
  for (const std::string& text : {deep, std::string("{nope"), std::string("")}) {
    try {
      parse_request_body(text);
      ADD_FAILURE() << "no error";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code.value_or(""), "invalid_json");
    }
  }
  EXPECT_TRUE(parse_request_body(chat().dump()).is_object());
}

json completion(json extra = json::object()) {
  json body = {{"model", "m"}, {"prompt", "p"}};
  body.update(extra);
  return body;
}

std::string bad_completion_param(const json& body) {
  try {
    parse_completion_request(body, {}, {});
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.param.value_or("<none>");
  }
  return "";
}

TEST(OpenAIRequest, UnsupportedParametersAreNamed400s) {
  EXPECT_EQ(bad_param(chat({{"response_format", {{"type", "json_object"}}}})), "response_format");
  EXPECT_EQ(bad_param(chat({{"tools", {{{"type", "function"}}}}})), "tools");
  EXPECT_EQ(bad_param(chat({{"tool_choice", "auto"}})), "tool_choice");
  EXPECT_EQ(bad_param(chat({{"parallel_tool_calls", true}})), "parallel_tool_calls");
  EXPECT_EQ(bad_param(chat({{"echo", true}})), "echo");  // completions only
  EXPECT_EQ(bad_param(chat({{"stream_options", {{"include_obfuscation", true}}}})),
            "stream_options.include_obfuscation");
  EXPECT_EQ(bad_completion_param(completion({{"echo", true}})), "echo");
  EXPECT_EQ(bad_completion_param(completion({{"best_of", 3}})), "best_of");
  EXPECT_EQ(bad_completion_param(completion({{"suffix", "}"}})), "suffix");
  EXPECT_EQ(bad_completion_param(completion({{"messages", json::array()}})), "messages");
  EXPECT_EQ(bad_completion_param(completion({{"top_logprobs", 1}})), "top_logprobs");
  // The values that ask for nothing pass.
  EXPECT_EQ(bad_param(chat({{"response_format", {{"type", "text"}}},
                            {"tools", json::array()},
                            {"tool_choice", "none"},
                            {"user", "u"}})),
            "");
  EXPECT_EQ(bad_completion_param(completion({{"echo", false}, {"best_of", 1}, {"suffix", ""}})),
            "");
}

TEST(OpenAIRequest, SamplingExtrasAndLogprobs) {
  const auto r = parse_chat_request(chat({{"presence_penalty", 1.5},
                                          {"frequency_penalty", -0.5},
                                          {"logit_bias", {{"7", -100}, {"42", 2.5}}},
                                          {"logprobs", true},
                                          {"top_logprobs", 4},
                                          {"seed", 18446744073709551615ull}}),
                                    {}, {});
  EXPECT_EQ(r.options.sampling.presence_penalty, 1.5);
  EXPECT_EQ(r.options.sampling.frequency_penalty, -0.5);
  EXPECT_EQ(r.options.sampling.logit_bias,
            (std::vector<std::pair<int32_t, double>>{{42, 2.5}, {7, -100.0}}));
  EXPECT_TRUE(r.options.logprobs);
  EXPECT_EQ(r.options.top_logprobs, 4);
  EXPECT_EQ(r.options.sampling.seed, 18446744073709551615ull);
  const auto c = parse_completion_request(completion({{"logprobs", 3}}), {}, {});
  EXPECT_TRUE(c.options.logprobs);
  EXPECT_EQ(c.options.top_logprobs, 3);
  EXPECT_FALSE(parse_completion_request(completion(), {}, {}).options.logprobs);

  EXPECT_EQ(bad_param(chat({{"presence_penalty", 2.5}})), "presence_penalty");
  EXPECT_EQ(bad_param(chat({{"frequency_penalty", "x"}})), "frequency_penalty");
  EXPECT_EQ(bad_param(chat({{"logit_bias", {{"x", 1}}}})), "logit_bias");
  EXPECT_EQ(bad_param(chat({{"logit_bias", {{"-1", 1}}}})), "logit_bias");
  EXPECT_EQ(bad_param(chat({{"logit_bias", {{"5", 150}}}})), "logit_bias");
  EXPECT_EQ(bad_param(chat({{"logit_bias", json::array()}})), "logit_bias");
  EXPECT_EQ(bad_param(chat({{"top_logprobs", 2}})), "top_logprobs");  // needs logprobs
  EXPECT_EQ(bad_param(chat({{"logprobs", true}, {"top_logprobs", 21}})), "top_logprobs");
  EXPECT_EQ(bad_param(chat({{"logprobs", 1}})), "logprobs");
  EXPECT_EQ(bad_completion_param(completion({{"logprobs", 6}})), "logprobs");
}

TEST(OpenAIRequest, IntegersThatWouldWrapAre400s) {
  EXPECT_EQ(bad_param(chat({{"top_k", int64_t(1) << 32}})), "top_k");
  EXPECT_EQ(bad_param(chat({{"top_k", -1}})), "top_k");
  EXPECT_EQ(bad_param(chat({{"max_tokens", 18446744073709551615ull}})), "max_tokens");
  EXPECT_EQ(bad_param(chat({{"kv_bits", 4}, {"kv_group_size", int64_t(1) << 40}})),
            "kv_group_size");
  EXPECT_EQ(bad_param(chat({{"quantized_kv_start", -1}})), "quantized_kv_start");
  EXPECT_EQ(bad_param(chat({{"n", int64_t(1) << 40}})), "n");
  EXPECT_EQ(parse_chat_request(chat({{"top_k", 40}}), {}, {}).options.sampling.top_k, 40);
}

TEST(OpenAIRequest, CompletionPromptIsAStringOrOneStringArray) {
  EXPECT_EQ(parse_completion_request({{"prompt", "a"}}, {}, {}).prompt, "a");
  EXPECT_EQ(parse_completion_request({{"prompt", {"b"}}}, {}, {}).prompt, "b");
  EXPECT_THROW(parse_completion_request({{"prompt", 5}}, {}, {}), ApiError);
  EXPECT_THROW(parse_completion_request({{"prompt", {"a", "b"}}}, {}, {}), ApiError);
  EXPECT_THROW(parse_completion_request(json::object(), {}, {}), ApiError);
}

TEST(OpenAIError, BodyHasTheFourFields) {
  const auto body = error_body("bad", "invalid_request_error", "max_tokens", std::nullopt);
  EXPECT_EQ(body["error"]["message"], "bad");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_TRUE(body["error"]["code"].is_null());
}

// A stream's error event and a plain reply type an exception alike.
TEST(OpenAIError, ExceptionsBecomeTypedReplies) {
  auto reply = [](auto e) { return error_reply(std::make_exception_ptr(e)); };
  const ErrorReply bad = reply(InvalidArgument("does not fit", "max_tokens"));
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.message, "does not fit");
  EXPECT_EQ(bad.type, "invalid_request_error");
  EXPECT_EQ(bad.param, "max_tokens");
  EXPECT_EQ(bad.code, "invalid_value");
  const ErrorReply busy = reply(Overloaded("full"));
  EXPECT_EQ(busy.status, 429);
  EXPECT_EQ(busy.type, "server_busy");
  EXPECT_EQ(busy.code, "overloaded");
  const ErrorReply api =
      reply(ApiError(404, "no such model", "invalid_request_error", "model", "model_not_found"));
  EXPECT_EQ(api.status, 404);
  EXPECT_EQ(api.code, "model_not_found");
  const ErrorReply other = reply(std::runtime_error("disk on fire"));
  EXPECT_EQ(other.status, 500);
  EXPECT_EQ(other.type, "server_error");
  EXPECT_EQ(other.message, "disk on fire");
  EXPECT_FALSE(other.param.has_value());
  EXPECT_EQ(reply(42).message, "internal error");
}

}  // namespace
}  // namespace turbokv::server
