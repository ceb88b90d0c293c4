// UTF-8 helpers (see utf8.h).
#include "core/utf8.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace turbokv::utf8 {

size_t find_invalid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    const size_t len = seq_len(b);
    if (len == 1 || i + len > n) return i;
    char32_t cp = b & (0xFF >> (len + 1));
    for (size_t k = 1; k < len; ++k) {
      const unsigned char c = s[i + k];
      if ((c & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (c & 0x3F);
    }
    const char32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

char32_t next(std::string_view s, size_t& pos) {
  const unsigned char b = s[pos];
  const size_t len = seq_len(b);
  if (len == 1 || pos + len > s.size()) {
    ++pos;
    return b;
  }
  char32_t cp = b & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + k]) & 0x3F);
  pos += len;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_space(char32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85) return true;
  if (cp < 0x80) return false;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

namespace {

bool is_cased(char32_t cp) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

template <typename Map>
std::string map_code_points(std::string_view s, Map map) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) map(next(s, pos), out);
  return out;
}

// Unconditional multi-character mappings of Unicode SpecialCasing.txt that Python applies:
// {code point, lower, title, upper}.
struct SpecialCase {
  char32_t cp;
  const char* lower;
  const char* title;
  const char* upper;
};
constexpr SpecialCase kSpecialCases[] = {
    {0x00DF, "\u00DF", "Ss", "SS"},           {0x0130, "i\u0307", "\u0130", "\u0130"},
    {0x0149, "\u0149", "\u02BCN", "\u02BCN"}, {0xFB00, "\uFB00", "Ff", "FF"},
    {0xFB01, "\uFB01", "Fi", "FI"},           {0xFB02, "\uFB02", "Fl", "FL"},
    {0xFB03, "\uFB03", "Ffi", "FFI"},         {0xFB04, "\uFB04", "Ffl", "FFL"},
    {0xFB05, "\uFB05", "St", "ST"},           {0xFB06, "\uFB06", "St", "ST"},
};

enum class Case { kLower, kTitle, kUpper };

void append_case(char32_t cp, Case c, std::string& out) {
  for (const SpecialCase& special : kSpecialCases) {
    if (special.cp == cp) {
      out += c == Case::kLower ? special.lower : c == Case::kTitle ? special.title : special.upper;
      return;
    }
  }
  const auto code = static_cast<utf8proc_int32_t>(cp);
  append(out, c == Case::kLower   ? utf8proc_tolower(code)
              : c == Case::kTitle ? utf8proc_totitle(code)
                                  : utf8proc_toupper(code));
}

}  // namespace

std::string to_upper(std::string_view s) {
  return map_code_points(s,
                         [](char32_t cp, std::string& out) { append_case(cp, Case::kUpper, out); });
}
std::string to_lower(std::string_view s) {
  return map_code_points(s,
                         [](char32_t cp, std::string& out) { append_case(cp, Case::kLower, out); });
}

std::string to_title(std::string_view s) {
  bool previous_cased = false;
  return map_code_points(s, [&](char32_t cp, std::string& out) {
    append_case(cp, previous_cased ? Case::kLower : Case::kTitle, out);
    previous_cased = is_cased(cp);
  });
}

std::string capitalize(std::string_view s) {
  bool first = true;
  return map_code_points(s, [&](char32_t cp, std::string& out) {
    append_case(cp, first ? Case::kTitle : Case::kLower, out);
    first = false;
  });
}

size_t count_code_points(std::string_view s) {
  size_t count = 0;
  for (const char c : s) count += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return count;
}

std::string normalize(std::string_view s, std::string_view form) {
  int options = UTF8PROC_STABLE;
  if (form == "NFC") {
    options |= UTF8PROC_COMPOSE;
  } else if (form == "NFD") {
    options |= UTF8PROC_DECOMPOSE;
  } else if (form == "NFKC") {
    options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  } else if (form == "NFKD") {
    options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  } else {
    throw InvalidArgument(
        str_cat("unicode normalization form '", form, "' is not one of NFC, NFD, NFKC, NFKD"));
  }
  utf8proc_uint8_t* result = nullptr;
  const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                static_cast<utf8proc_ssize_t>(s.size()), &result,
                                static_cast<utf8proc_option_t>(options));
  if (len < 0) {
    throw InvalidArgument(str_cat("cannot ", form, "-normalize text: ", utf8proc_errmsg(len)));
  }
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
  return std::string(reinterpret_cast<const char*>(result), static_cast<size_t>(len));
}

namespace {

// GPT-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100 upwards in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> to_unicode;
  std::array<int, 0x200> from_unicode;
  ByteAlphabet() {
    from_unicode.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? b : 0x100 + extra++;
      append(to_unicode[b], cp);
      from_unicode[cp] = b;
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet table;
  return table;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() {
  return alphabet().to_unicode;
}

int unicode_to_byte(char32_t cp) {
  return cp < 0x200 ? alphabet().from_unicode[cp] : -1;
}

}  // namespace turbokv::utf8
