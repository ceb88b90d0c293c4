// Typed reads of config.json fields with errors that name the file, the field and the value.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace turbokv::config_json {

// A field that is absent or null reads as std::nullopt; a value of the wrong type throws
// FormatError("<path>: field 'key' is <value>, expected <what>").
// get_int reads an int field: a value outside [-2^31, 2^31 - 1] is a FormatError naming the
// range, so that no field silently wraps when it is stored in an int. Wider fields give their
// own range to the overload with lo and hi.
std::optional<int64_t> get_int(const nlohmann::json& j, const char* key, const std::string& path);
std::optional<int64_t> get_int(const nlohmann::json& j, const char* key, const std::string& path,
                               int64_t lo, int64_t hi);
std::optional<double> get_number(const nlohmann::json& j, const char* key, const std::string& path);
std::optional<bool> get_bool(const nlohmann::json& j, const char* key, const std::string& path);
std::optional<std::string> get_string(const nlohmann::json& j, const char* key,
                                      const std::string& path);
// As get_int, but absent/null throws FormatError naming the missing field.
int64_t require_int(const nlohmann::json& j, const char* key, const std::string& path);
int64_t require_int(const nlohmann::json& j, const char* key, const std::string& path, int64_t lo,
                    int64_t hi);
// INT32_MAX: the largest value of an int field.
inline constexpr int64_t kIntMax = 2147483647;

}  // namespace turbokv::config_json
