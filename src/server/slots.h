// Server slots, as llama.cpp's server has them: a fixed number of sessions (turbokv/engine.h)
// that requests pick with "id_slot" and that POST /v1/slots/{id}?action=save|restore|erase
// writes to, reads from or clears. Slot files live in one directory given at startup
// (--slot-save-path); a request names a file in it, never a path.
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "turbokv/engine.h"

namespace turbokv::server {

// dir/name when name is a plain file name: 1 to 128 characters among letters, digits, '.',
// '_' and '-', not starting with '.'. Anything else (a '/', "..", a hidden name, an empty name)
// is an ApiError 400 with param "filename"; so is a name that is a symbolic link in dir.
std::string slot_file_path(const std::string& dir, const std::string& name);

class SlotTable {
 public:
  // count sessions with the engine's default KV settings. save_dir "" disables save/restore.
  SlotTable(Engine& engine, int count, std::string save_dir);

  int count() const { return static_cast<int>(slots_.size()); }
  // The session of slot id; ApiError 400 (param id_slot) for an id out of range, 409 when a
  // request is using it.
  std::shared_ptr<Session> acquire_for_request(int64_t id) const;

  // The actions of POST /v1/slots/{id}: the response bodies of llama.cpp's server. ApiError:
  // 400 for a bad id, file name or file, 404 for a missing file, 409 for a busy slot.
  nlohmann::json save(int64_t id, const std::string& filename);
  nlohmann::json restore(int64_t id, const std::string& filename);
  nlohmann::json erase(int64_t id);
  // GET /v1/slots: [{id, n_tokens, n_cached, busy, kv_bytes, kv_bytes_dense}].
  nlohmann::json list() const;

 private:
  std::shared_ptr<Session> slot(int64_t id) const;
  std::string file_path(const std::string& filename) const;

  Engine& engine_;
  std::string dir_;
  mutable std::mutex mu_;  // guards slots_ (restore replaces a slot's session)
  std::vector<std::shared_ptr<Session>> slots_;
};

}  // namespace turbokv::server
