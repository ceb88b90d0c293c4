// Whole-file reads and JSON parsing with located errors: config files, tokenizer files, chat
// templates and text inputs all go through these, so every caller reports the same errors.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace turbokv {

// The bytes of the file at path. Throws IoError("cannot open '<path>'").
std::string read_file(const std::string& path);

// The deepest nesting of arrays and objects that parse_json_located accepts. Printing, copying
// or comparing a JSON value recurses once per level, so deeper documents are refused before they
// are parsed (real configs, tokenizers and requests nest fewer than 20 levels).
inline constexpr size_t kMaxJsonDepth = 256;

// The byte offset of the first bracket that nests text's arrays/objects deeper than max_depth, or
// std::string_view::npos when none does. Brackets inside strings do not count; the text need not
// be valid JSON (a syntax error is the parser's to report).
size_t find_json_depth_excess(std::string_view text, size_t max_depth = kMaxJsonDepth);

// A short rendering of a JSON value for error messages: at most about max_chars characters
// (cut with "..."), nesting below a few levels shown as [...] / {...}.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 64);

// Parses JSON text; a syntax error becomes a FormatError naming `what`, the byte offset, the
// line and the column, and so does nesting deeper than kMaxJsonDepth. Json is nlohmann::json or
// nlohmann::ordered_json.
template <typename Json>
Json parse_json_located(const std::string& text, const std::string& what);

// parse_json_located(read_file(path), path): a config file such as config.json.
nlohmann::json read_json_file(const std::string& path);

}  // namespace turbokv
