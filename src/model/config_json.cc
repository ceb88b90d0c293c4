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

// Any integer (or integral float) that fits 64 bits.
std::optional<int64_t> get_int64(const nlohmann::json& j, const char* key, const std::string& path) {
  const nlohmann::json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) {
    bad_field(*v, key, path, "an integer within 64 bits");
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {  // 32.0 is 32; 1e300 and 2.5 are not integers
    const double d = v->get<double>();
    if (d >= -9.2e18 && d <= 9.2e18 && d == double(int64_t(d))) return int64_t(d);
  }
  bad_field(*v, key, path, "an integer");
}

}  // namespace

std::optional<int64_t> get_int(const nlohmann::json& j, const char* key, const std::string& path) {
  return get_int(j, key, path, -kIntMax - 1, kIntMax);
}

std::optional<int64_t> get_int(const nlohmann::json& j, const char* key, const std::string& path,
                               int64_t lo, int64_t hi) {
  const std::optional<int64_t> v = get_int64(j, key, path);
  if (v && (*v < lo || *v > hi)) {
    throw FormatError(str_cat(path, ": field '", key, "' is ", *v, ", expected an integer in [", lo,
                              ", ", hi, "]"));
  }
  return v;
}

int64_t require_int(const nlohmann::json& j, const char* key, const std::string& path, int64_t lo,
                    int64_t hi) {
  const std::optional<int64_t> v = get_int(j, key, path, lo, hi);
  if (!v) throw FormatError(str_cat(path, ": required field '", key, "' is missing"));
  return *v;
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
  return require_int(j, key, path, -kIntMax - 1, kIntMax);
}

}  // namespace turbokv::config_json
