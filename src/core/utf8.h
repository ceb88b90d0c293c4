// UTF-8 helpers shared by the tokenizer and the template engine: code point iteration,
// validation, encoding, Unicode case/space properties (utf8proc) and the GPT-2 byte<->char map.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace turbokv::utf8 {

// Length of the UTF-8 sequence that starts with byte b (1 for an invalid lead byte).
inline size_t seq_len(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b >> 5) == 0x6) return 2;
  if ((b >> 4) == 0xE) return 3;
  if ((b >> 3) == 0x1E) return 4;
  return 1;
}

// Byte offset of the first invalid sequence, or npos when s is valid UTF-8.
size_t find_invalid(std::string_view s);

// Decodes the code point at s[pos] and advances pos. s must be valid UTF-8.
char32_t next(std::string_view s, size_t& pos);

void append(std::string& out, char32_t cp);

// Python str semantics on code points.
bool is_space(char32_t cp);  // str.isspace()
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);
std::string to_title(std::string_view s);    // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
size_t count_code_points(std::string_view s);

// Unicode normalization forms (utf8proc). Throws InvalidArgument on invalid UTF-8.
std::string normalize(std::string_view s, std::string_view form);  // "NFC", "NFKC", "NFD", "NFKD"

// GPT-2 byte-level alphabet: every byte maps to one printable code point, stored as UTF-8.
const std::array<std::string, 256>& byte_to_unicode();
// Inverse map, -1 for code points that are not in the alphabet.
int unicode_to_byte(char32_t cp);

}  // namespace turbokv::utf8
