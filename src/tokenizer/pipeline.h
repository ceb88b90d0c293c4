// The stages of a HF tokenizer.json pipeline around the model: normalizer (text -> text),
// pre-tokenizer (text -> pieces the model encodes one by one), post-processor (adds special
// tokens such as BOS) and decoder (tokens -> text). Each is built from its JSON object; `where`
// names that object's location in tokenizer.json for error messages.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tokenizer/regex.h"

namespace turbokv {

using json = nlohmann::json;

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece further (in place). first_segment: the pieces come from the start of
  // the input (before any added token), which Metaspace's prepend_scheme "first" needs.
  virtual void split(std::vector<std::string>& pieces, bool first_segment) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;
  // Ids this processor puts before the text (e.g. BOS), for TokenizerConfig::add_bos_token.
  virtual std::vector<int32_t> prefix_ids() const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};

// Each returns nullptr for a JSON null (the stage is absent). Throw FormatError for a
// malformed object and Unsupported for a type we do not implement.
std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where);
std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where);
std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where);

// JSON access that fails with a FormatError naming the location and the expected type.
const json& json_member(const json& obj, const char* key, const std::string& where);
std::string json_string(const json& obj, const char* key, const std::string& where);
std::string json_string_or(const json& obj, const char* key, const std::string& fallback,
                           const std::string& where);
bool json_bool_or(const json& obj, const char* key, bool fallback, const std::string& where);
int64_t json_int_or(const json& obj, const char* key, int64_t fallback, const std::string& where);

// The steps of a "Sequence" stage: obj[key] must be an array; element i is built by make (one
// of the make_* above) at "<where>.<key>[i]", and null elements are skipped.
template <typename Stage>
std::vector<std::unique_ptr<Stage>> json_sequence(
    const json& obj, const char* key, const std::string& where,
    std::unique_ptr<Stage> (*make)(const json&, const std::string&)) {
  const json& list = json_member(obj, key, where);
  if (!list.is_array()) {
    throw FormatError(str_cat("tokenizer.json: ", where, ".", key, " must be an array"));
  }
  std::vector<std::unique_ptr<Stage>> steps;
  for (size_t i = 0; i < list.size(); ++i) {
    if (auto step = make(list[i], str_cat(where, ".", key, "[", i, "]"))) {
      steps.push_back(std::move(step));
    }
  }
  return steps;
}

// A pattern object: {"String": literal} or {"Regex": pattern}.
Regex make_pattern(const json& j, const std::string& where);

// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

}  // namespace turbokv
