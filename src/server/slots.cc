// Slot sessions and their files (see slots.h).
#include "server/slots.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "server/openai.h"

namespace turbokv::server {

using nlohmann::json;

namespace {

ApiError bad_filename(const std::string& message) {
  return ApiError(400, message, "invalid_request_error", "filename", "invalid_filename");
}

bool allowed_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

std::string slot_file_path(const std::string& dir, const std::string& name) {
  constexpr size_t kMaxName = 128;
  if (name.empty() || name.size() > kMaxName || name[0] == '.' ||
      !std::all_of(name.begin(), name.end(), allowed_char)) {
    throw bad_filename(str_cat("'filename' must be a plain file name of 1 to ", kMaxName,
                               " letters, digits, '.', '_' or '-', not starting with '.'"));
  }
  const std::filesystem::path path = std::filesystem::path(dir) / name;
  std::error_code error;
  if (std::filesystem::is_symlink(path, error)) {
    throw bad_filename(str_cat("'", name, "' is a symbolic link in the slot directory"));
  }
  return path.string();
}

SlotTable::SlotTable(Engine& engine, int count, std::string save_dir)
    : engine_(engine), dir_(std::move(save_dir)) {
  for (int i = 0; i < count; ++i) slots_.push_back(engine.new_session());
}

std::shared_ptr<Session> SlotTable::slot(int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= static_cast<int64_t>(slots_.size())) {
    throw ApiError(400, str_cat("slot ", id, " does not exist: slots are 0..", slots_.size() - 1),
                   "invalid_request_error", "id_slot", "invalid_value");
  }
  return slots_[size_t(id)];
}

std::shared_ptr<Session> SlotTable::acquire_for_request(int64_t id) const {
  auto session = slot(id);
  if (session->busy()) {
    throw ApiError(409, str_cat("slot ", id, " is busy with another request"),
                   "invalid_request_error", "id_slot", "slot_busy");
  }
  return session;
}

std::string SlotTable::file_path(const std::string& filename) const {
  if (dir_.empty()) {
    throw ApiError(400, "slot save/restore is off: start the server with --slot-save-path DIR",
                   "invalid_request_error", std::nullopt, "slot_save_disabled");
  }
  return slot_file_path(dir_, filename);
}

json SlotTable::save(int64_t id, const std::string& filename) {
  const std::string path = file_path(filename);
  auto session = acquire_for_request(id);
  const auto start = std::chrono::steady_clock::now();
  try {
    engine_.save_session(*session, path);
  } catch (const InvalidArgument& e) {  // it became busy meanwhile
    throw ApiError(409, e.what(), "invalid_request_error", "id_slot", "slot_busy");
  }
  std::error_code error;
  const auto bytes = std::filesystem::file_size(path, error);
  return {{"id_slot", id},
          {"filename", filename},
          {"n_saved", session->tokens().size()},
          {"n_written", error ? 0 : bytes},
          {"timings", {{"save_ms", ms_since(start)}}}};
}

json SlotTable::restore(int64_t id, const std::string& filename) {
  const std::string path = file_path(filename);
  acquire_for_request(id);  // checks the id and that the slot is idle now
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw ApiError(404, str_cat("no slot file '", filename, "' in the slot directory"),
                   "invalid_request_error", "filename", "file_not_found");
  }
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Session> loaded;
  try {
    loaded = engine_.load_session(path);
  } catch (const FormatError& e) {
    throw ApiError(400, e.what(), "invalid_request_error", "filename", "invalid_cache_file");
  } catch (const InvalidArgument& e) {
    throw ApiError(400, e.what(), "invalid_request_error", "filename", "incompatible_cache_file");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_[size_t(id)]->busy()) {
      throw ApiError(409, str_cat("slot ", id, " is busy with another request"),
                     "invalid_request_error", "id_slot", "slot_busy");
    }
    slots_[size_t(id)] = loaded;
  }
  const auto bytes = std::filesystem::file_size(path, error);
  return {{"id_slot", id},
          {"filename", filename},
          {"n_restored", loaded->tokens().size()},
          {"n_read", error ? 0 : bytes},
          {"timings", {{"restore_ms", ms_since(start)}}}};
}

json SlotTable::erase(int64_t id) {
  auto session = acquire_for_request(id);
  const size_t n = session->tokens().size();
  try {
    session->clear();
  } catch (const InvalidArgument& e) {
    throw ApiError(409, e.what(), "invalid_request_error", "id_slot", "slot_busy");
  }
  return {{"id_slot", id}, {"n_erased", n}};
}

json SlotTable::list() const {
  std::vector<std::shared_ptr<Session>> slots;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots = slots_;
  }
  json out = json::array();
  for (size_t i = 0; i < slots.size(); ++i) {
    out.push_back({{"id", i},
                   {"n_tokens", slots[i]->tokens().size()},
                   {"n_cached", slots[i]->cached_tokens()},
                   {"busy", slots[i]->busy()},
                   {"kv_bytes", slots[i]->kv_bytes()},
                   {"kv_bytes_dense", slots[i]->kv_bytes_dense()}});
  }
  return out;
}

}  // namespace turbokv::server
