#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/text_file.h"

namespace turbokv {
namespace {

bool parse_dtype(const std::string& s, DType* out) {
  static const std::map<std::string, DType> kNames = {
      {"F64", DType::F64}, {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16},
      {"I64", DType::I64}, {"I32", DType::I32}, {"I16", DType::I16}, {"I8", DType::I8},
      {"U8", DType::U8},   {"BOOL", DType::BOOL}, {"U32", DType::U32}};
  auto it = kNames.find(s);
  if (it == kNames.end()) return false;
  *out = it->second;
  return true;
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::U32: return "U32";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::U32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16:
    case DType::I16: return 2;
    case DType::I8:
    case DType::U8:
    case DType::BOOL: return 1;
  }
  return 0;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile st;
  st.file_ = MappedFile(path);
  const uint8_t* base = st.file_.data();
  const size_t size = st.file_.size();
  auto fail = [&](const std::string& what) {
    throw FormatError(str_cat("invalid safetensors file '", path, "': ", what));
  };
  if (size < 8) fail(str_cat("file is ", size, " bytes, shorter than the 8-byte header length"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > size - 8) {
    fail(str_cat("header length ", header_len, " exceeds the file size ", size,
                 " (truncated file?)"));
  }
  const std::string_view header_text(reinterpret_cast<const char*>(base + 8), header_len);
  if (const size_t deep = find_json_depth_excess(header_text); deep != std::string_view::npos) {
    fail(str_cat("header nests arrays/objects deeper than ", kMaxJsonDepth, " levels (at byte ",
                 8 + deep, ")"));
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& e) {
    fail(str_cat("header is not valid JSON (", e.what(), ")"));
  }
  if (!header.is_object()) fail("header is not a JSON object");
  const uint8_t* data = base + 8 + header_len;
  const size_t data_size = size - 8 - header_len;

  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_object()) {
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (m->is_string()) st.metadata_[m.key()] = m->get<std::string>();
        }
      }
      continue;
    }
    const std::string& name = it.key();
    const nlohmann::json& info = *it;
    TensorView t;
    t.name = name;
    if (!info.is_object() || !info.contains("dtype") || !info["dtype"].is_string() ||
        !info.contains("shape") || !info["shape"].is_array() || !info.contains("data_offsets") ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2) {
      fail(str_cat("tensor '", name, "' lacks a valid dtype, shape or data_offsets"));
    }
    if (!parse_dtype(info["dtype"].get<std::string>(), &t.dtype)) {
      fail(str_cat("tensor '", name, "' has unsupported dtype '",
                   info["dtype"].get<std::string>(), "'"));
    }
    uint64_t numel = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        fail(str_cat("tensor '", name, "' has an invalid shape entry ", json_excerpt(d)));
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t(1) << 48) / dim) fail(str_cat("tensor '", name, "' is too large"));
      numel *= dim;
      t.shape.push_back(int64_t(dim));
    }
    const auto& offs = info["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      fail(str_cat("tensor '", name, "' has non-integer data_offsets"));
    }
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      fail(str_cat("tensor '", name, "' data_offsets [", begin, ", ", end,
                   "] lie outside the data section of ", data_size, " bytes (truncated file?)"));
    }
    if (end - begin != numel * dtype_size(t.dtype)) {
      fail(str_cat("tensor '", name, "' has ", end - begin, " bytes but shape ", t.shape_string(),
                   " of ", dtype_name(t.dtype), " needs ", numel * dtype_size(t.dtype)));
    }
    t.data = data + begin;
    t.nbytes = size_t(end - begin);
    ranges.emplace_back(begin, end);
    st.index_[name] = st.tensors_.size();
    st.tensors_.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) fail("tensor data ranges overlap");
  }
  return st;
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorView& SafetensorsFile::at(const std::string& name) const {
  const TensorView* t = find(name);
  if (t == nullptr) throw FormatError(str_cat("tensor '", name, "' not found in '", path(), "'"));
  return *t;
}

std::vector<float> SafetensorsFile::to_f32(const TensorView& t) {
  const size_t n = size_t(t.numel());
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::F32: std::memcpy(&out[i], t.data + 4 * i, 4); break;
      case DType::F64: {
        double v;
        std::memcpy(&v, t.data + 8 * i, 8);
        out[i] = float(v);
        break;
      }
      case DType::F16:
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = t.dtype == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
        break;
      }
      default:
        throw FormatError(str_cat("tensor '", t.name, "' has dtype ", dtype_name(t.dtype),
                                  ", expected a floating-point dtype"));
    }
  }
  return out;
}

std::vector<int64_t> SafetensorsFile::to_i64(const TensorView& t) {
  const size_t n = size_t(t.numel());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::I64: std::memcpy(&out[i], t.data + 8 * i, 8); break;
      case DType::I32: {
        int32_t v;
        std::memcpy(&v, t.data + 4 * i, 4);
        out[i] = v;
        break;
      }
      case DType::I16: {
        int16_t v;
        std::memcpy(&v, t.data + 2 * i, 2);
        out[i] = v;
        break;
      }
      case DType::U32: {
        uint32_t v;
        std::memcpy(&v, t.data + 4 * i, 4);
        out[i] = v;
        break;
      }
      case DType::I8: out[i] = int8_t(t.data[i]); break;
      case DType::U8:
      case DType::BOOL: out[i] = t.data[i]; break;
      default:
        throw FormatError(str_cat("tensor '", t.name, "' has dtype ", dtype_name(t.dtype),
                                  ", expected an integer dtype"));
    }
  }
  return out;
}

}  // namespace turbokv
