// Typed config.json reads (config_json.h).
#include "model/config_json.h"

#include "core/error.h"
#include "core/text_file.h"

namespace turbokv::config_json {
namespace {

const nlohmann::json* field(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void bad_field(const nlohmann::json& value, const char* key, const std::string& path,
                            const char* expected) {
  throw FormatError(
      str_cat(path, ": field '", key, "' is ", json_excerpt(value), ", expected ", expected));
}

}  // namespace

std::optional<int64_t> get_int(const nlohmann::json& j, const char* key, const std::string& path) {
  const nlohmann::json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float() && v->get<double>() == double(int64_t(v->get<double>()))) {
    return int64_t(v->get<double>());
  }
  bad_field(*v, key, path, "an integer");
}

std::optional<double> get_number(const nlohmann::json& j, const char* key,
                                 const std::string& path) {
  const nlohmann::json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) bad_field(*v, key, path, "a number");
  return v->get<double>();
}

std::optional<bool> get_bool(const nlohmann::json& j, const char* key, const std::string& path) {
  const nlohmann::json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) bad_field(*v, key, path, "true or false");
  return v->get<bool>();
}

std::optional<std::string> get_string(const nlohmann::json& j, const char* key,
                                      const std::string& path) {
  const nlohmann::json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) bad_field(*v, key, path, "a string");
  return v->get<std::string>();
}

int64_t require_int(const nlohmann::json& j, const char* key, const std::string& path) {
  std::optional<int64_t> v = get_int(j, key, path);
  if (!v) throw FormatError(str_cat(path, ": required field '", key, "' is missing"));
  return *v;
}

}  // namespace turbokv::config_json
