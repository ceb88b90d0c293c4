// GgufFile (gguf.h): a bounds-checked cursor over the mapping; every count is checked against
// the bytes left before anything is allocated for it.
#include "core/gguf.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace turbokv {
namespace {

constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;

class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  uint64_t offset() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " length");
    if (n > left()) {
      throw FormatError(str_cat(path_, ": ", what, " at byte ", pos_ - 8, " has length ", n,
                                ", past the end of the file (", left(), " bytes left)"));
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_t(n));
    pos_ += n;
    return s;
  }

  // Throws unless count elements of at least min_bytes each fit in the bytes left.
  void check_count(uint64_t count, uint64_t min_bytes, const std::string& what) const {
    if (min_bytes > 0 && count > left() / min_bytes) {
      throw FormatError(str_cat(path_, ": ", what, " is ", count, ", more than the ", left(),
                                " bytes left in the file can hold"));
    }
  }

 private:
  void need(uint64_t n, const std::string& what) const {
    if (n > left()) {
      throw FormatError(str_cat(path_, ": truncated: ", what, " at byte ", pos_, " needs ", n,
                                " bytes, ", left(), " left"));
    }
  }

  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

// Smallest encoding of one value of a kind (for count checks).
uint64_t min_value_bytes(uint32_t kind) {
  switch (kind) {
    case GgufValue::kU8:
    case GgufValue::kI8:
    case GgufValue::kBool:
      return 1;
    case GgufValue::kU16:
    case GgufValue::kI16:
      return 2;
    case GgufValue::kU32:
    case GgufValue::kI32:
    case GgufValue::kF32:
      return 4;
    case GgufValue::kString:
    case GgufValue::kU64:
    case GgufValue::kI64:
    case GgufValue::kF64:
      return 8;
    case GgufValue::kArray:
      return 12;
    default:
      return 0;
  }
}

const char* kind_name(uint32_t kind) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  return kind < 13 ? kNames[kind] : "unknown";
}

// A scalar of kind into v (integer, real); throws for a bad bool or an out-of-range u64.
void read_scalar(Cursor& in, uint32_t kind, const std::string& what, const std::string& path,
                 GgufValue& v) {
  switch (kind) {
    case GgufValue::kU8:
      v.integer = in.read<uint8_t>(what);
      break;
    case GgufValue::kI8:
      v.integer = in.read<int8_t>(what);
      break;
    case GgufValue::kU16:
      v.integer = in.read<uint16_t>(what);
      break;
    case GgufValue::kI16:
      v.integer = in.read<int16_t>(what);
      break;
    case GgufValue::kU32:
      v.integer = in.read<uint32_t>(what);
      break;
    case GgufValue::kI32:
      v.integer = in.read<int32_t>(what);
      break;
    case GgufValue::kI64:
      v.integer = in.read<int64_t>(what);
      break;
    case GgufValue::kU64: {
      const uint64_t u = in.read<uint64_t>(what);
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) {
        throw FormatError(str_cat(path, ": ", what, " is ", u, ", too large"));
      }
      v.integer = int64_t(u);
      break;
    }
    case GgufValue::kBool: {
      const uint8_t b = in.read<uint8_t>(what);
      if (b > 1)
        throw FormatError(str_cat(path, ": ", what, " is bool ", int(b), ", expected 0 or 1"));
      v.integer = b;
      break;
    }
    case GgufValue::kF32:
      v.real = in.read<float>(what);
      return;
    case GgufValue::kF64:
      v.real = in.read<double>(what);
      return;
    default:
      throw FormatError(
          str_cat(path, ": ", what, " has unknown value type ", kind, " (known: 0..12)"));
  }
  v.real = double(v.integer);
}

void read_value(Cursor& in, uint32_t kind, const std::string& what, const std::string& path,
                int depth, GgufValue& v) {
  v.kind = GgufValue::Kind(kind);
  if (kind == GgufValue::kString) {
    v.string = in.string(what);
    return;
  }
  if (kind != GgufValue::kArray) {
    read_scalar(in, kind, what, path, v);
    return;
  }
  if (depth >= kMaxArrayDepth) {
    throw FormatError(str_cat(path, ": ", what, " nests arrays deeper than ", kMaxArrayDepth));
  }
  const uint32_t element = in.read<uint32_t>(what + " element type");
  if (min_value_bytes(element) == 0) {
    throw FormatError(
        str_cat(path, ": ", what, " has unknown element type ", element, " (known: 0..12)"));
  }
  const uint64_t n = in.read<uint64_t>(what + " length");
  in.check_count(n, min_value_bytes(element), what + " length");
  v.element_kind = GgufValue::Kind(element);
  v.array_size = n;
  if (element == GgufValue::kString) {
    v.strings.reserve(size_t(n));
    for (uint64_t i = 0; i < n; ++i) v.strings.push_back(in.string(what));
  } else if (element == GgufValue::kArray) {
    GgufValue inner;
    for (uint64_t i = 0; i < n; ++i) read_value(in, element, what, path, depth + 1, inner);
  } else {
    v.numbers.reserve(size_t(n));
    GgufValue scalar;
    for (uint64_t i = 0; i < n; ++i) {
      read_scalar(in, element, what, path, scalar);
      v.numbers.push_back(scalar.real);
    }
  }
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  if (path.ends_with(".gguf")) return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

const char* gguf_type_name(uint32_t type) {
  switch (GgufType(type)) {
    case GgufType::F32:
      return "F32";
    case GgufType::F16:
      return "F16";
    case GgufType::Q4_0:
      return "Q4_0";
    case GgufType::Q4_1:
      return "Q4_1";
    case GgufType::Q5_0:
      return "Q5_0";
    case GgufType::Q5_1:
      return "Q5_1";
    case GgufType::Q8_0:
      return "Q8_0";
    case GgufType::Q8_1:
      return "Q8_1";
    case GgufType::Q2_K:
      return "Q2_K";
    case GgufType::Q3_K:
      return "Q3_K";
    case GgufType::Q4_K:
      return "Q4_K";
    case GgufType::Q5_K:
      return "Q5_K";
    case GgufType::Q6_K:
      return "Q6_K";
    case GgufType::Q8_K:
      return "Q8_K";
    case GgufType::BF16:
      return "BF16";
  }
  return nullptr;
}

GgufBlock gguf_block(uint32_t type) {
  switch (GgufType(type)) {
    case GgufType::F32:
      return {1, 4};
    case GgufType::F16:
    case GgufType::BF16:
      return {1, 2};
    case GgufType::Q4_0:
      return {32, 18};
    case GgufType::Q4_1:
      return {32, 20};
    case GgufType::Q5_0:
      return {32, 22};
    case GgufType::Q5_1:
      return {32, 24};
    case GgufType::Q8_0:
      return {32, 34};
    case GgufType::Q8_1:
      return {32, 36};
    case GgufType::Q2_K:
      return {256, 84};
    case GgufType::Q3_K:
      return {256, 110};
    case GgufType::Q4_K:
      return {256, 144};
    case GgufType::Q5_K:
      return {256, 176};
    case GgufType::Q6_K:
      return {256, 210};
    case GgufType::Q8_K:
      return {256, 292};
  }
  return {};
}

bool GgufValue::is_integer() const {
  return kind == kU8 || kind == kI8 || kind == kU16 || kind == kI16 || kind == kU32 ||
         kind == kI32 || kind == kU64 || kind == kI64;
}

std::string gguf_kind_name(const GgufValue& v) {
  if (v.kind == GgufValue::kArray) return str_cat("array of ", kind_name(v.element_kind));
  return kind_name(v.kind);
}

std::string GgufTensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += str_cat(i ? ", " : "", ne[i]);
  return s + "]";
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.file_ = MappedFile(path);
  Cursor in(f.file_.data(), f.file_.size(), f.file_.path());
  if (f.file_.size() < 4 || std::memcmp(f.file_.data(), "GGUF", 4) != 0) {
    throw FormatError(str_cat(path, ": not a GGUF file (the first 4 bytes are not \"GGUF\")"));
  }
  in.read<uint32_t>("magic");
  f.version_ = in.read<uint32_t>("version");
  if (f.version_ != 2 && f.version_ != 3) {
    const bool swapped = f.version_ == 0x02000000u || f.version_ == 0x03000000u;
    throw FormatError(str_cat(path, ": GGUF version ", f.version_,
                              swapped ? " (a big-endian file)" : "",
                              " is not supported (supported: 2, 3, little-endian)"));
  }
  const uint64_t n_tensors = in.read<uint64_t>("tensor count");
  const uint64_t n_kv = in.read<uint64_t>("metadata count");
  in.check_count(n_kv, 8 + 4 + 1, "metadata count");
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = in.string(str_cat("metadata key ", i));
    if (f.metadata_.count(key) != 0) {
      throw FormatError(str_cat(path, ": metadata key '", key, "' appears twice"));
    }
    const uint32_t kind = in.read<uint32_t>(str_cat("type of metadata '", key, "'"));
    GgufValue value;
    read_value(in, kind, str_cat("metadata '", key, "'"), path, 0, value);
    f.metadata_.emplace(key, std::move(value));
  }
  if (const GgufValue* a = f.find("general.alignment")) {
    if (!a->is_integer() || a->integer <= 0 || (a->integer & (a->integer - 1)) != 0) {
      throw FormatError(str_cat(path, ": general.alignment is ",
                                a->is_number() ? str_cat(a->real) : gguf_kind_name(*a),
                                ", expected a power of two"));
    }
    f.alignment_ = uint64_t(a->integer);
  }

  in.check_count(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor count");
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = in.string(str_cat("name of tensor ", i));
    const std::string what = str_cat("tensor '", t.name, "'");
    const uint32_t n_dims = in.read<uint32_t>(what + " dimension count");
    if (n_dims < 1 || n_dims > kMaxDims) {
      throw FormatError(
          str_cat(path, ": ", what, " has ", n_dims, " dimensions, expected 1..", kMaxDims));
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = in.read<uint64_t>(what + " dimensions");
      if (ne == 0 || ne > (uint64_t(1) << 40) || numel > (uint64_t(1) << 62) / ne) {
        throw FormatError(str_cat(path, ": ", what, " has dimension ", d, " of size ", ne,
                                  ", expected 1..2^40 and at most 2^62 values in all"));
      }
      numel *= ne;
      t.ne.push_back(int64_t(ne));
    }
    t.type = in.read<uint32_t>(what + " type");
    const GgufBlock block = gguf_block(t.type);
    if (block.elems == 0) {
      throw FormatError(str_cat(path, ": ", what, " has unknown tensor type id ", t.type,
                                " (known: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, "
                                "Q2_K..Q8_K)"));
    }
    if (uint64_t(t.ne[0]) % uint64_t(block.elems) != 0) {
      throw FormatError(str_cat(path, ": ", what, " of type ", gguf_type_name(t.type), " has ",
                                t.ne[0], " values per row, not a multiple of its block size ",
                                block.elems));
    }
    t.nbytes = numel / uint64_t(block.elems) * uint64_t(block.bytes);
    t.offset = in.read<uint64_t>(what + " offset");
    if (t.offset % f.alignment_ != 0) {
      throw FormatError(str_cat(path, ": ", what, " starts at data offset ", t.offset,
                                ", not a multiple of the alignment ", f.alignment_));
    }
    if (f.index_.count(t.name) != 0) {
      throw FormatError(str_cat(path, ": tensor '", t.name, "' appears twice"));
    }
    f.index_[t.name] = f.tensors_.size();
    f.tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (in.offset() + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  const uint64_t size = f.file_.size();
  for (GgufTensor& t : f.tensors_) {
    if (data_start > size || t.offset > size - data_start ||
        t.nbytes > size - data_start - t.offset) {
      throw FormatError(str_cat(path, ": tensor '", t.name, "' (", gguf_type_name(t.type), " ",
                                t.shape_string(), ", ", t.nbytes, " bytes at data offset ",
                                t.offset, ") runs past the end of the file (data section of ",
                                data_start > size ? 0 : size - data_start, " bytes)"));
    }
    t.data = f.file_.data() + data_start + t.offset;
  }
  return f;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

[[noreturn]] void wrong_kind(const std::string& path, const std::string& key, const GgufValue& v,
                             const char* expected) {
  throw FormatError(
      str_cat(path, ": metadata '", key, "' is ", gguf_kind_name(v), ", expected ", expected));
}

}  // namespace

std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_integer()) wrong_kind(path(), key, *v, "an integer");
  return v->integer;
}

std::optional<double> GgufFile::get_number(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) wrong_kind(path(), key, *v, "a number");
  return v->real;
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->kind != GgufValue::kBool) wrong_kind(path(), key, *v, "a bool");
  return v->integer != 0;
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->kind != GgufValue::kString) wrong_kind(path(), key, *v, "a string");
  return v->string;
}

const std::vector<std::string>* GgufFile::get_strings(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return nullptr;
  if (v->kind != GgufValue::kArray || v->element_kind != GgufValue::kString) {
    wrong_kind(path(), key, *v, "an array of strings");
  }
  return &v->strings;
}

const std::vector<double>* GgufFile::get_numbers(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return nullptr;
  if (v->kind != GgufValue::kArray || v->element_kind == GgufValue::kString ||
      v->element_kind == GgufValue::kArray) {
    wrong_kind(path(), key, *v, "an array of numbers");
  }
  return &v->numbers;
}

}  // namespace turbokv
