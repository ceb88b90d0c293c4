// Read-only memory mapping of a whole file (model weights, fixtures, cache files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace turbokv {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws IoError naming the path when the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace turbokv
