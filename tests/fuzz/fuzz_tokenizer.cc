// libFuzzer target: a tokenizer.json (the input up to a NUL byte) built, then used: encode the
// text after the NUL (valid UTF-8 or not) and a few fixed strings, decode every id it has.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/text_file.h"
#include "tokenizer/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  const char* nul = static_cast<const char*>(std::memchr(text, 0, size));
  const std::string json(text, nul ? nul : text + size);
  const std::string input = nul ? std::string(nul + 1, text + size) : std::string("Hello world");
  try {
    const turbokv::HfTokenizer tokenizer(
        turbokv::parse_json_located<nlohmann::json>(json, "tokenizer.json"));
    for (const std::string& s : {input, std::string(" héllo  wörld\n\t1234 <s>"), std::string()}) {
      try {
        const std::vector<int32_t> ids = tokenizer.encode(s, /*add_special_tokens=*/true);
        tokenizer.decode(ids, /*skip_special_tokens=*/false);
        tokenizer.decode(ids, /*skip_special_tokens=*/true);
      } catch (const turbokv::Error&) {
      }
    }
    const int n = std::min(tokenizer.vocab_size(), 512);
    for (int32_t id = -1; id <= n; ++id) {
      try {
        const int32_t one[] = {id};
        tokenizer.decode(one, false);
        tokenizer.token_to_id(tokenizer.id_to_token(id));
      } catch (const turbokv::Error&) {
      }
    }
  } catch (const turbokv::Error&) {
  }
  return 0;
}
