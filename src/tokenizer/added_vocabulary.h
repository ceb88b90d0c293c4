// Added tokens of tokenizer.json (special tokens like <|im_start|> and user-added tokens).
// Like HF, tokens with normalized=false are found in the raw text, the others in the normalized
// text of what lies between them; both before pre-tokenization, leftmost-longest like HF's
// Aho-Corasick matcher, honouring lstrip/rstrip/single_word.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace turbokv {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class AddedVocabulary {
 public:
  // Adds (or replaces, by id) one token.
  void add(AddedToken token);

  // A piece of the input: either an added token (id >= 0) or plain text (id == -1).
  struct Segment {
    size_t begin, end;  // byte offsets into the text
    int32_t id;
  };
  // Splits on the tokens whose `normalized` flag equals normalized_tokens.
  std::vector<Segment> split(std::string_view text, bool normalized_tokens) const;

  const AddedToken* by_id(int32_t id) const;
  std::optional<int32_t> by_content(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> index_by_id_;
  // Token indices by first byte, longest first.
  std::vector<size_t> by_first_byte_[256];
};

}  // namespace turbokv
