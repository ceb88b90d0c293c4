// Tokenizer interface (HF tokenizer.json: byte-level BPE and SentencePiece-style BPE) and the
// model-dir special-token configuration. Implementations must equal the HF `tokenizers`
// library id for id and byte for byte.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace turbokv {

// tokenizer_config.json + generation_config.json of a model directory.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  bool add_bos_token = false;  // explicit "add_bos_token" or the post_processor of tokenizer.json
  std::string chat_template;   // empty if the model has none
  std::vector<int32_t> eos_token_ids;  // from generation_config.json (int or list), else eos_token
};

// The const methods of an implementation may be called from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Throws IoError / FormatError (with the JSON location) / Unsupported (naming the feature).
  static std::unique_ptr<Tokenizer> from_file(const std::string& tokenizer_json);
  // tokenizer.json plus tokenizer_config.json / generation_config.json when present; or, when
  // dir names a GGUF file, the tokenizer in its metadata (gguf_tokenizer.h).
  static std::unique_ptr<Tokenizer> from_model_dir(const std::string& dir);

  // add_special_tokens applies the post-processor (e.g. BOS) like HF's encode().
  virtual std::vector<int32_t> encode(std::string_view text,
                                      bool add_special_tokens = true) const = 0;
  virtual std::string decode(std::span<const int32_t> ids,
                             bool skip_special_tokens = false) const = 0;
  virtual int vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual const TokenizerConfig& config() const = 0;
};

// Streaming detokenizer: push ids one at a time, get the text that is now final. Never emits
// a partial UTF-8 sequence; flush() returns the rest at the end.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  // ids_[prefix_offset_, read_offset_) were emitted last time; ids_[read_offset_, end) are new.
  size_t prefix_offset_ = 0, read_offset_ = 0;
};

}  // namespace turbokv
