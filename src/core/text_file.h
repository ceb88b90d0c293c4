// Whole-file reads and JSON parsing with located errors: config files, tokenizer files, chat
// templates and text inputs all go through these, so every caller reports the same errors.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace turbokv {

// The bytes of the file at path. Throws IoError("cannot open '<path>'").
std::string read_file(const std::string& path);

// Parses JSON text; a syntax error becomes a FormatError naming `what`, the byte offset, the
// line and the column. Json is nlohmann::json or nlohmann::ordered_json.
template <typename Json>
Json parse_json_located(const std::string& text, const std::string& what);

// parse_json_located(read_file(path), path): a config file such as config.json.
nlohmann::json read_json_file(const std::string& path);

}  // namespace turbokv
