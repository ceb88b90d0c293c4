// Added-token matching (see added_vocabulary.h).
#include "tokenizer/added_vocabulary.h"

#include <algorithm>
#include <cctype>

#include "core/utf8.h"

namespace turbokv {
namespace {

bool is_word_char(char32_t cp) {
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) || cp == '_';
  return !utf8::is_space(cp);
}

// Code point ending just before byte offset pos (pos > 0).
char32_t code_point_before(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return utf8::next(text, start);
}

}  // namespace

void AddedVocabulary::add(AddedToken token) {
  if (token.content.empty()) return;
  auto it = index_by_id_.find(token.id);
  if (it != index_by_id_.end()) {
    tokens_[it->second] = std::move(token);
  } else {
    index_by_id_[token.id] = tokens_.size();
    tokens_.push_back(std::move(token));
  }
  for (auto& bucket : by_first_byte_) bucket.clear();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](size_t a, size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

const AddedToken* AddedVocabulary::by_id(int32_t id) const {
  auto it = index_by_id_.find(id);
  return it == index_by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::by_content(std::string_view content) const {
  for (const AddedToken& token : tokens_) {
    if (token.content == content) return token.id;
  }
  return std::nullopt;
}

std::vector<AddedVocabulary::Segment> AddedVocabulary::split(std::string_view text,
                                                             bool normalized_tokens) const {
  std::vector<Segment> segments;
  size_t plain_begin = 0;  // start of the plain text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* match = nullptr;
    for (const size_t index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& token = tokens_[index];
      if (token.normalized != normalized_tokens) continue;
      if (text.compare(pos, token.content.size(), token.content) != 0) continue;
      const size_t end = pos + token.content.size();
      if (token.single_word) {
        const bool word_before = pos > 0 && is_word_char(code_point_before(text, pos));
        size_t after = end;
        const bool word_after = end < text.size() && is_word_char(utf8::next(text, after));
        if (word_before || word_after) continue;
      }
      match = &token;
      break;
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + match->content.size();
    if (match->lstrip) {
      while (begin > plain_begin && utf8::is_space(code_point_before(text, begin))) {
        size_t start = begin - 1;
        while ((static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        begin = start;
      }
    }
    if (match->rstrip) {
      while (end < text.size()) {
        size_t next = end;
        if (!utf8::is_space(utf8::next(text, next))) break;
        end = next;
      }
    }
    if (begin > plain_begin) segments.push_back({plain_begin, begin, -1});
    segments.push_back({begin, end, match->id});
    plain_begin = pos = end;
  }
  if (plain_begin < text.size()) segments.push_back({plain_begin, text.size(), -1});
  return segments;
}

}  // namespace turbokv
