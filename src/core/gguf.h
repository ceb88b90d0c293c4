// GGUF reader (llama.cpp's single-file checkpoint format, versions 2 and 3): mmaps the file and
// validates the whole header (magic, version, metadata key/values, tensor infos, alignment,
// every tensor's bytes inside the file) before any tensor is touched.
//
// Layout, little-endian: "GGUF", u32 version, u64 tensor count, u64 metadata count; metadata
// entries { string key; u32 type; value }; tensor infos { string name; u32 n_dims;
// u64 ne[n_dims]; u32 type; u64 offset }; padding to general.alignment (default 32); the data
// section, where each tensor starts at its offset (a multiple of the alignment). A string is
// u64 length + bytes; an array is u32 element type + u64 count + elements. ne[0] is the
// fastest-varying dimension: a matrix [rows, cols] is stored as ne = {cols, rows}.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace turbokv {

// GGUF tensor type ids (ggml_type) this reader knows by name; see gguf_type_name.
enum class GgufType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

// "Q4_K", ... or nullptr for an id no ggml version has used for a tensor type we name.
const char* gguf_type_name(uint32_t type);
// Values per block and bytes per block of a known type id ({0, 0} when unknown).
struct GgufBlock {
  int64_t elems = 0, bytes = 0;
};
GgufBlock gguf_block(uint32_t type);

// One metadata value. Scalars fill the field of their kind; arrays of strings fill strings,
// arrays of numbers or bools fill numbers (nested arrays are read and dropped: array_depth).
struct GgufValue {
  enum Kind : uint32_t {
    kU8 = 0,
    kI8 = 1,
    kU16 = 2,
    kI16 = 3,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kU64 = 10,
    kI64 = 11,
    kF64 = 12,
  };
  Kind kind = kU8;
  Kind element_kind = kU8;  // arrays
  int64_t integer = 0;      // integer kinds and bool (u64 above INT64_MAX is rejected)
  double real = 0;          // f32/f64, and every number (integers too)
  std::string string;
  std::vector<std::string> strings;  // array of strings
  std::vector<double> numbers;       // array of numbers / bools
  uint64_t array_size = 0;

  bool is_integer() const;
  bool is_number() const { return is_integer() || kind == kF32 || kind == kF64; }
};

// The kind name ("u32", "string", "array of string", ...), for error messages.
std::string gguf_kind_name(const GgufValue& v);

struct GgufTensor {
  std::string name;
  uint32_t type = 0;
  std::vector<int64_t> ne;  // ne[0] fastest
  const uint8_t* data = nullptr;
  uint64_t offset = 0;  // in the data section
  uint64_t nbytes = 0;

  std::string shape_string() const;  // "[cols, rows]" in file order
};

// True when path names a regular file named *.gguf or starting with the GGUF magic.
bool is_gguf_file(const std::string& path);

class GgufFile {
 public:
  // Throws IoError (missing/unreadable) or FormatError naming the file and what is wrong: bad
  // magic, unsupported version, a string, array or count running past the end of the file,
  // an unknown value or tensor type id, bad alignment, a tensor past the end of the data.
  static GgufFile open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(const std::string& name) const;

  // Metadata access; nullopt/null when absent, FormatError naming the file, the key, its kind
  // and the expected one when present with another kind.
  const GgufValue* find(const std::string& key) const;
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_number(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  const std::vector<std::string>* get_strings(const std::string& key) const;
  const std::vector<double>* get_numbers(const std::string& key) const;

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace turbokv
