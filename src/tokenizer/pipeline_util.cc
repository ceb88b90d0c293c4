// JSON accessors with located errors and lossy UTF-8 conversion for the pipeline stages.
#include "core/error.h"
#include "tokenizer/pipeline.h"

namespace turbokv {

const json& json_member(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) {
    throw FormatError(
        str_cat("tokenizer.json: ", where, " must be an object, got ", obj.type_name()));
  }
  auto it = obj.find(key);
  if (it == obj.end())
    throw FormatError(str_cat("tokenizer.json: ", where, ".", key, " is missing"));
  return *it;
}

std::string json_string(const json& obj, const char* key, const std::string& where) {
  const json& value = json_member(obj, key, where);
  if (!value.is_string()) {
    throw FormatError(
        str_cat("tokenizer.json: ", where, ".", key, " must be a string, got ", value.type_name()));
  }
  return value.get<std::string>();
}

std::string json_string_or(const json& obj, const char* key, const std::string& fallback,
                           const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return fallback;
  return json_string(obj, key, where);
}

bool json_bool_or(const json& obj, const char* key, bool fallback, const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return fallback;
  if (!obj[key].is_boolean()) {
    throw FormatError(str_cat("tokenizer.json: ", where, ".", key, " must be a boolean, got ",
                              obj[key].type_name()));
  }
  return obj[key].get<bool>();
}

int64_t json_int_or(const json& obj, const char* key, int64_t fallback, const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return fallback;
  if (!obj[key].is_number_integer()) {
    throw FormatError(str_cat("tokenizer.json: ", where, ".", key, " must be an integer, got ",
                              obj[key].type_name()));
  }
  return obj[key].get<int64_t>();
}

std::string utf8_lossy(std::string_view bytes) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  size_t i = 0;
  auto byte = [&](size_t k) { return static_cast<unsigned char>(bytes[k]); };
  while (i < n) {
    const unsigned char b = byte(i);
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    // Valid range of the second byte for each lead (Unicode Table 3-7), then continuation bytes.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t good = 1;  // bytes of this sequence that are valid so far
    if (i + 1 < n && byte(i + 1) >= lo && byte(i + 1) <= hi) {
      good = 2;
      while (good < len && i + good < n && (byte(i + good) & 0xC0) == 0x80) ++good;
    }
    if (good == len) {
      out.append(bytes.substr(i, len));
    } else {
      out += kReplacement;  // the maximal invalid prefix counts once
    }
    i += good;
  }
  return out;
}

}  // namespace turbokv
