// Shared by the fuzz targets: loaders that read paths get the input as a temporary file (or
// folder), one per target and process, rewritten on every run and removed at exit.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace turbokv::fuzz {

// A path under $TMPDIR (or /tmp) unique to this process, removed (with what is under it) when
// the process exits normally.
inline std::string temp_path(const std::string& name) {
  struct Removed {
    std::vector<std::string> paths;
    ~Removed() {
      std::error_code ec;
      for (const std::string& p : paths) std::filesystem::remove_all(p, ec);
    }
  };
  static Removed removed;
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/turbokv-fuzz-" +
                     std::to_string(::getpid()) + "-" + name;
  removed.paths.push_back(path);
  return path;
}

inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

inline std::string fixture(const std::string& rel) {
  return std::string(TURBOKV_SOURCE_DIR) + "/tests/fixtures/" + rel;
}

}  // namespace turbokv::fuzz
