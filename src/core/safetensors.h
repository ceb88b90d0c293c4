// safetensors reader: mmaps one file, validates the header (length, JSON, dtypes, shapes,
// offsets inside the data section, no overlap) before any tensor is touched.
// Format: u64 little-endian header length N, N bytes of JSON, then the data section.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace turbokv {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, U32 };

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapping
  size_t nbytes = 0;

  int64_t numel() const;
  std::string shape_string() const;  // "[4, 1024, 128]"
};

class SafetensorsFile {
 public:
  // Throws IoError (missing/unreadable) or FormatError naming the file and what is wrong.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const TensorView* find(const std::string& name) const;
  // Throws FormatError naming the tensor and the file when absent.
  const TensorView& at(const std::string& name) const;

  // Converting copies (F32/F16/BF16/F64 -> float; integer dtypes -> int64). Throw FormatError
  // naming the tensor when the dtype cannot be converted.
  static std::vector<float> to_f32(const TensorView& t);
  static std::vector<int64_t> to_i64(const TensorView& t);

 private:
  MappedFile file_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace turbokv
