// The tokenizer.json implementation of Tokenizer: added tokens -> normalizer -> pre-tokenizer
// -> BPE -> post-processor on encode; tokens -> decoder on decode (HF `tokenizers` semantics).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/tokenizer.h"

namespace turbokv {

class HfTokenizer final : public Tokenizer {
 public:
  // root: the parsed tokenizer.json.
  explicit HfTokenizer(const nlohmann::json& root);
  // Reads and parses a tokenizer.json file; a JSON syntax error names its byte, line and column.
  static std::unique_ptr<HfTokenizer> load(const std::string& path);
  // Reads tokenizer_config.json and generation_config.json of dir when present.
  void load_model_config(const std::string& dir);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const override;
  int vocab_size() const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::string id_to_token(int32_t id) const override;
  bool is_special(int32_t id) const override;
  const TokenizerConfig& config() const override { return config_; }

  // Sets the special-token configuration directly (GGUF metadata instead of a model dir);
  // prepend_bos: put BOS before the text on encode(add_special_tokens).
  void set_config(TokenizerConfig config, bool prepend_bos) {
    config_ = std::move(config);
    prepend_bos_ = prepend_bos && config_.bos_token.has_value();
  }

  // Turns the BPE per-piece cache off (benchmark: cached vs plain BPE).
  void set_cache_enabled(bool enabled) { model_->set_cache_enabled(enabled); }

 private:
  // The string of id (added token or vocab entry). Throws InvalidArgument naming an unknown id
  // and the vocabulary range.
  const std::string& token_string(int32_t id) const;

  std::unique_ptr<BpeModel> model_;
  AddedVocabulary added_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  TokenizerConfig config_;
  bool prepend_bos_ = false;  // tokenizer_config asks for BOS the post-processor does not add
};

}  // namespace turbokv
