// Typed reads of config.json fields with errors that name the file, the field and the value.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace turbokv::config_json {

// A field that is absent or null reads as std::nullopt; a value of the wrong type throws
// FormatError("<path>: field 'key' is <value>, expected <what>").
std::optional<int64_t> get_int(const nlohmann::json& j, const char* key, const std::string& path);
std::optional<double> get_number(const nlohmann::json& j, const char* key, const std::string& path);
std::optional<bool> get_bool(const nlohmann::json& j, const char* key, const std::string& path);
std::optional<std::string> get_string(const nlohmann::json& j, const char* key,
                                      const std::string& path);
// As get_int, but absent/null throws FormatError naming the missing field.
int64_t require_int(const nlohmann::json& j, const char* key, const std::string& path);

}  // namespace turbokv::config_json
