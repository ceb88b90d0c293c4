// libFuzzer target: the input as a chat template, parsed and rendered with a conversation that
// has a system prompt, tool definitions, a tool call and its result.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "template/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Weather in Zürich?"},
      {"role": "assistant", "content": "",
       "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                       "arguments": {"city": "Zürich"}}}]},
      {"role": "tool", "content": "{\"temp_c\": 21}"},
      {"role": "assistant", "content": "It is 21 °C."},
      {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"
  })");
  try {
    turbokv::ChatTemplate t =
        turbokv::ChatTemplate::parse(std::string(reinterpret_cast<const char*>(data), size));
    std::tm now{};
    now.tm_year = 124;
    now.tm_mday = 26;
    t.set_now(now);
    t.render_ordered(vars);
  } catch (const turbokv::Error&) {
  }
  return 0;
}
