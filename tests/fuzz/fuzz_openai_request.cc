// libFuzzer target: the input as a request body of /v1/chat/completions and /v1/completions:
// body parsing, field validation, the KV options and the sampling options as the engine
// resolves and validates them. Only turbokv errors (ApiError, InvalidArgument) may come out.
#include "core/error.h"
#include "engine/sampler.h"
#include "kv/kv_resolve.h"
#include "server/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json body;
  try {
    body = turbokv::server::parse_request_body(text);
  } catch (const turbokv::Error&) {
    return 0;
  }
  turbokv::KVOptions server_kv;
  server_kv.kv_bits = 3.5;
  for (const bool chat : {true, false}) {
    try {
      const turbokv::server::RequestLimits limits{512};
      const turbokv::server::ApiRequest r =
          chat ? turbokv::server::parse_chat_request(body, limits, server_kv)
               : turbokv::server::parse_completion_request(body, limits, server_kv);
      turbokv::validate_sampling(r.options.sampling);
      if (r.options.kv) turbokv::resolve_kv_options(*r.options.kv);
    } catch (const turbokv::Error&) {
    }
  }
  return 0;
}
