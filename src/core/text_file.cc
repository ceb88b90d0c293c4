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

size_t find_json_depth_excess(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

namespace {

// s[0, n) with n moved back to the start of a UTF-8 character.
std::string utf8_prefix(const std::string& s, size_t n) {
  if (n >= s.size()) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

// Appends value to out, giving up (with "...") once out passes limit or below depth 4.
void write_excerpt(const nlohmann::json& value, int depth, size_t limit, std::string& out) {
  if (out.size() > limit) return;
  if (value.is_array() || value.is_object()) {
    const bool array = value.is_array();
    if (value.empty()) {
      out += array ? "[]" : "{}";
      return;
    }
    if (depth >= 4) {
      out += array ? "[...]" : "{...}";
      return;
    }
    out += array ? '[' : '{';
    bool first = true;
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (out.size() > limit) break;
      if (!first) out += ", ";
      first = false;
      if (!array) out += nlohmann::json(it.key()).dump() + ": ";
      write_excerpt(*it, depth + 1, limit, out);
    }
    out += array ? ']' : '}';
    return;
  }
  if (value.is_string() && value.get_ref<const std::string&>().size() > limit) {
    const std::string& s = value.get_ref<const std::string&>();
    out += nlohmann::json(utf8_prefix(s, limit))
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return;
  }
  out += value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string out;
  write_excerpt(value, 0, max_chars, out);
  if (out.size() > max_chars) out = utf8_prefix(out, max_chars) + "...";
  return out;
}

template <typename Json>
Json parse_json_located(const std::string& text, const std::string& what) {
  auto located = [&](size_t byte) {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return str_cat(what, ": malformed JSON at byte ", byte, " (line ", line, ", column ", column,
                   "): ");
  };
  if (const size_t deep = find_json_depth_excess(text); deep != std::string_view::npos) {
    throw FormatError(
        str_cat(located(deep), "arrays and objects nest deeper than ", kMaxJsonDepth, " levels"));
  }
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const size_t byte = e.byte > 0 ? e.byte - 1 : 0;  // nlohmann counts from 1
    throw FormatError(located(byte) + e.what());
  } catch (const nlohmann::json::out_of_range& e) {  // a number past double, e.g. 1e999
    throw FormatError(str_cat(what, ": malformed JSON: ", e.what()));
  }
}
template nlohmann::json parse_json_located<nlohmann::json>(const std::string&, const std::string&);
template nlohmann::ordered_json parse_json_located<nlohmann::ordered_json>(const std::string&,
                                                                           const std::string&);

nlohmann::json read_json_file(const std::string& path) {
  return parse_json_located<nlohmann::json>(read_file(path), path);
}

}  // namespace turbokv
