// PCRE2 wrapper (see regex.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace turbokv {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern) : impl_(std::make_unique<Impl>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error_code,
                              &error_offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw FormatError(str_cat("invalid regex '", pattern, "' at offset ", error_offset, ": ",
                              reinterpret_cast<const char*>(message)));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex Regex::literal(std::string_view text) {
  std::string pattern = "\\Q";
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = text.find("\\E", pos);
    if (end == std::string_view::npos) {
      pattern.append(text.substr(pos));
      break;
    }
    pattern.append(text.substr(pos, end - pos)).append("\\E\\\\E\\Q");
    pos = end + 2;
  }
  pattern += "\\E";
  return Regex(pattern);
}

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, 0,
                                                data.get(), nullptr)
                              : pcre2_match(impl_->code, subject, text.size(), start,
                                            PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw FormatError(str_cat("regex match failed: ", reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {  // empty match: step over one code point
      if (begin >= text.size()) break;
      size_t pos = begin;
      do {
        ++pos;
      } while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80);
      start = pos;
    }
  }
  return matches;
}

std::string Regex::replace_all(std::string_view text, std::string_view replacement) const {
  std::string out;
  size_t last = 0;
  for (const auto& [begin, end] : find_all(text)) {
    out.append(text.substr(last, begin - last)).append(replacement);
    last = end;
  }
  out.append(text.substr(last));
  return out;
}

}  // namespace turbokv
