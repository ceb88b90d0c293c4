// Whole-file reads and located JSON parse errors (text_file.h).
#include "core/text_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace turbokv {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str_cat("cannot open '", path, "'"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

template <typename Json>
Json parse_json_located(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const size_t byte = e.byte > 0 ? e.byte - 1 : 0;  // nlohmann counts from 1
    size_t line = 1, column = 1;
    for (size_t i = 0; i < byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw FormatError(str_cat(what, ": malformed JSON at byte ", byte, " (line ", line, ", column ",
                              column, "): ", e.what()));
  }
}
template nlohmann::json parse_json_located<nlohmann::json>(const std::string&, const std::string&);
template nlohmann::ordered_json parse_json_located<nlohmann::ordered_json>(const std::string&,
                                                                           const std::string&);

nlohmann::json read_json_file(const std::string& path) {
  return parse_json_located<nlohmann::json>(read_file(path), path);
}

}  // namespace turbokv
