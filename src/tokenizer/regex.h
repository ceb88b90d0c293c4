// A compiled Unicode regular expression (PCRE2, UTF + UCP, JIT when available) used by the
// Split pre-tokenizer and the Replace normalizer/decoder. HF tokenizer.json regexes are
// Oniguruma syntax; the subset they use (\p{L}, \p{N}, (?i:...), (?!\S), {1,3}) is PCRE2's too.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace turbokv {

class Regex {
 public:
  // Throws FormatError naming the pattern and PCRE2's message and offset.
  explicit Regex(const std::string& pattern);
  static Regex literal(std::string_view text);  // matches text exactly
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // All non-overlapping matches, left to right, as [begin, end) byte offsets.
  // text must be valid UTF-8 (callers validate once per input).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  // Every match replaced by `replacement` (taken literally).
  std::string replace_all(std::string_view text, std::string_view replacement) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace turbokv
