// WeightStore (weights.h): opens single-file or sharded safetensors and checks every tensor
// the model asks for.
#include "model/weights.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/text_file.h"

namespace turbokv {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  TensorView v;
  v.shape = shape;
  return v.shape_string();
}

}  // namespace

WeightStore WeightStore::open(const std::string& dir) {
  namespace fs = std::filesystem;
  WeightStore store;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> expected_shard;  // tensor -> shard file name
  std::vector<std::string> shards;
  if (fs::exists(index_path)) {
    const nlohmann::json index = read_json_file(index_path.string());
    auto map = index.find("weight_map");
    if (map == index.end() || !map->is_object()) {
      throw FormatError(str_cat(index_path.string(), ": missing object 'weight_map'"));
    }
    std::set<std::string> seen;
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string()) {
        throw FormatError(str_cat(index_path.string(), ": weight_map entry '", name, "' is ",
                                  file.dump(), ", expected a file name"));
      }
      const std::string shard = file.get<std::string>();
      expected_shard[name] = shard;
      if (seen.insert(shard).second) shards.push_back(shard);
    }
  } else {
    shards.push_back("model.safetensors");
  }
  for (const std::string& shard : shards) {
    const fs::path path = fs::path(dir) / shard;
    if (!fs::exists(path)) {
      throw IoError(
          str_cat("weights file ", path.string(), " is missing",
                  expected_shard.empty() ? "" : " (listed in model.safetensors.index.json)"));
    }
    store.files_.push_back(SafetensorsFile::open(path.string()));
  }
  for (const SafetensorsFile& file : store.files_) {
    for (const TensorView& t : file.tensors()) store.tensors_[t.name] = {&t, &file};
  }
  const fs::path config_path = fs::path(dir) / "config.json";
  if (fs::exists(config_path)) {
    const nlohmann::json config = read_json_file(config_path.string());
    for (const char* key : {"quantization", "quantization_config"}) {
      if (config.is_object() && config.contains(key) && config[key].is_object() &&
          config[key].contains("bits")) {
        store.quantization_ = config[key];
        break;
      }
    }
    store.config_path_ = config_path.string();
  }
  for (const auto& [name, shard] : expected_shard) {
    auto it = store.tensors_.find(name);
    if (it == store.tensors_.end() ||
        fs::path(it->second.second->path()).filename().string() != shard) {
      throw FormatError(str_cat("tensor '", name, "' is listed in ", index_path.string(), " under ",
                                shard, " but that file does not hold it"));
    }
  }
  return store;
}

const TensorView& WeightStore::tensor(const std::string& name,
                                      const std::vector<int64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    throw FormatError(str_cat("tensor '", name, "' (expected shape ", shape_text(shape),
                              ") is missing from the model's safetensors"));
  }
  const TensorView& t = *it->second.first;
  const std::string& file = it->second.second->path();
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16) {
    throw FormatError(str_cat("tensor '", name, "' in ", file, " has dtype ", dtype_name(t.dtype),
                              ", expected F32, F16 or BF16"));
  }
  if (t.shape != shape) {
    throw FormatError(str_cat("tensor '", name, "' in ", file, " has shape ", t.shape_string(),
                              ", expected ", shape_text(shape)));
  }
  return t;
}

bool WeightStore::has(const std::string& name) const {
  if (gguf_) {
    auto it = gguf_map_.hf_to_gguf.find(name);
    return it != gguf_map_.hf_to_gguf.end() && gguf_->find_tensor(it->second) != nullptr;
  }
  return tensors_.count(name) != 0;
}

WeightMatrix WeightStore::matrix(const std::string& name, int64_t rows, int64_t cols) const {
  if (gguf_) return gguf_matrix(name, rows, cols);
  auto it = tensors_.find(name);
  if (it != tensors_.end() && it->second.first->dtype == DType::U32) {
    return affine_matrix(name, *it->second.first, rows, cols);
  }
  const TensorView& t = tensor(name, {rows, cols});
  return WeightMatrix{t.dtype, t.data, rows, cols};
}

WeightMatrix WeightStore::stacked_matrix(const std::string& name, int64_t count, int64_t index,
                                         int64_t rows, int64_t cols) const {
  if (gguf_) throw Unsupported(str_cat("tensor '", name, "': stacked matrices in a GGUF file"));
  if (index < 0 || index >= count) {
    throw InvalidArgument(str_cat("tensor '", name, "': matrix ", index, " of ", count));
  }
  const TensorView& t = tensor(name, {count, rows, cols});
  const size_t bytes = size_t(rows) * size_t(cols) * dtype_size(t.dtype);
  return WeightMatrix{t.dtype, t.data + size_t(index) * bytes, rows, cols};
}

std::vector<float> WeightStore::vector(const std::string& name, int64_t n) const {
  if (gguf_) return gguf_vector(name, n);
  return SafetensorsFile::to_f32(tensor(name, {n}));
}

std::vector<float> WeightStore::floats(const std::string& name,
                                       const std::vector<int64_t>& shape) const {
  if (gguf_) {
    throw Unsupported(str_cat("tensor '", name, "': GGUF files are read for matrices and vectors"));
  }
  return SafetensorsFile::to_f32(tensor(name, shape));
}

int64_t WeightStore::total_bytes() const {
  int64_t bytes = 0;
  if (gguf_) {
    for (const GgufTensor& t : gguf_->tensors()) bytes += int64_t(t.nbytes);
  }
  for (const auto& [name, entry] : tensors_) bytes += int64_t(entry.first->nbytes);
  return bytes;
}

WeightMatrix WeightStore::affine_matrix(const std::string& name, const TensorView& codes,
                                        int64_t rows, int64_t cols) const {
  const std::string& file = tensors_.at(name).second->path();
  const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
  // What config.json says about this module: (bits, group size), or dense.
  int want_bits = 0, want_group = 0;
  bool listed_dense = false;
  if (quantization_.is_object()) {
    const nlohmann::json* q = &quantization_;
    if (quantization_.contains(module)) {
      if (quantization_[module].is_boolean() && !quantization_[module].get<bool>()) {
        listed_dense = true;
      } else if (quantization_[module].is_object()) {
        q = &quantization_[module];
      }
    }
    if (q->contains("bits") && (*q)["bits"].is_number_integer()) want_bits = (*q)["bits"];
    if (q->contains("group_size") && (*q)["group_size"].is_number_integer()) {
      want_group = (*q)["group_size"];
    }
  }
  if (quantization_.is_null() || listed_dense) {
    throw FormatError(str_cat(
        "tensor '", name, "' in ", file, " holds U32 quantized codes but ",
        config_path_.empty() ? "the model has no config.json" : config_path_,
        listed_dense ? " lists the module as unquantized" : " has no \"quantization\" object"));
  }
  auto part = [&](const char* suffix) -> const TensorView& {
    const std::string part_name = module + suffix;
    auto it = tensors_.find(part_name);
    if (it == tensors_.end()) {
      throw FormatError(str_cat("quantized tensor '", name, "' in ", file, " has no '", part_name,
                                "' (MLX affine weights need .scales and .biases)"));
    }
    const TensorView& t = *it->second.first;
    if (t.dtype != DType::F16 && t.dtype != DType::BF16) {
      throw FormatError(str_cat("tensor '", part_name, "' in ", file, " has dtype ",
                                dtype_name(t.dtype), ", expected F16 or BF16"));
    }
    return t;
  };
  const TensorView& scales = part(".scales");
  const TensorView& biases = part(".biases");
  const int64_t packed = codes.shape.size() == 2 ? codes.shape[1] : 0;
  const int64_t groups = scales.shape.size() == 2 ? scales.shape[1] : 0;
  const bool shape_ok = codes.shape.size() == 2 && codes.shape[0] == rows && packed > 0 &&
                        (packed * 32) % cols == 0 && groups > 0 && cols % groups == 0 &&
                        scales.shape == std::vector<int64_t>{rows, groups} &&
                        biases.shape == scales.shape && biases.dtype == scales.dtype;
  const int bits = shape_ok ? int(packed * 32 / cols) : 0;
  const int group = shape_ok ? int(cols / groups) : 0;
  if (!shape_ok || bits != want_bits || group != want_group) {
    throw FormatError(
        str_cat("MLX quantized tensor '", name, "' in ", file, ": codes ", codes.shape_string(),
                ", scales ", scales.shape_string(), " ", dtype_name(scales.dtype), ", biases ",
                biases.shape_string(), " ", dtype_name(biases.dtype), " do not hold a [", rows,
                ", ", cols, "] matrix at ", want_bits, " bits in groups of ", want_group,
                " (expected codes [", rows, ", ", cols * want_bits / 32, "], scales and biases [",
                rows, ", ", want_group > 0 ? cols / want_group : 0, "] of one dtype)"));
  }
  WeightMatrix w{scales.dtype, codes.data, rows, cols};
  w.format = WeightFormat::kAffine;
  w.affine = AffineParams{scales.data, biases.data, scales.dtype, bits, group};
  try {
    check_weight_dtype(w);
  } catch (const InvalidArgument& e) {
    throw Unsupported(str_cat("tensor '", name, "' in ", file, ": ", e.what()));
  }
  return w;
}

WeightStore WeightStore::open_gguf(std::shared_ptr<const GgufFile> file, GgufTensorMap map) {
  WeightStore store;
  store.gguf_ = std::move(file);
  store.gguf_map_ = std::move(map);
  return store;
}

namespace {

// The kernels' format of a GGUF matrix type; false for types without kernels.
bool gguf_format(uint32_t type, WeightFormat* format, DType* dtype) {
  *dtype = DType::F32;
  *format = WeightFormat::kDense;
  switch (GgufType(type)) {
    case GgufType::F32:
      return true;
    case GgufType::F16:
      *dtype = DType::F16;
      return true;
    case GgufType::BF16:
      *dtype = DType::BF16;
      return true;
    case GgufType::Q8_0:
      *format = WeightFormat::kQ8_0;
      return true;
    case GgufType::Q4_0:
      *format = WeightFormat::kQ4_0;
      return true;
    case GgufType::Q5_0:
      *format = WeightFormat::kQ5_0;
      return true;
    case GgufType::Q4_K:
      *format = WeightFormat::kQ4_K;
      return true;
    case GgufType::Q6_K:
      *format = WeightFormat::kQ6_K;
      return true;
    default:
      return false;
  }
}

}  // namespace

WeightMatrix WeightStore::gguf_matrix(const std::string& name, int64_t rows, int64_t cols) const {
  auto it = gguf_map_.hf_to_gguf.find(name);
  const GgufTensor* t = it == gguf_map_.hf_to_gguf.end() ? nullptr : gguf_->find_tensor(it->second);
  if (t == nullptr) {
    throw FormatError(
        str_cat(gguf_->path(), ": tensor '", it == gguf_map_.hf_to_gguf.end() ? name : it->second,
                "' (expected shape [", cols, ", ", rows, "] in GGUF order) is missing"));
  }
  if (t->ne != std::vector<int64_t>{cols, rows}) {
    throw FormatError(str_cat(gguf_->path(), ": tensor '", t->name, "' has shape ",
                              t->shape_string(), ", expected [", cols, ", ", rows,
                              "] (GGUF order: values per row first)"));
  }
  WeightFormat format;
  DType dtype;
  if (!gguf_format(t->type, &format, &dtype)) {
    throw Unsupported(str_cat(gguf_->path(), ": tensor '", t->name, "' has type ",
                              gguf_type_name(t->type),
                              ", which has no kernel (supported: F32, F16, BF16, Q8_0, Q4_0, "
                              "Q5_0, Q4_K, Q6_K)"));
  }
  WeightMatrix w{dtype, t->data, rows, cols};
  w.format = format;
  auto perm = gguf_map_.permuted_heads.find(t->name);
  if (perm != gguf_map_.permuted_heads.end()) {
    if (perm->second <= 0 || rows % (2 * perm->second) != 0) {
      throw FormatError(str_cat(gguf_->path(), ": tensor '", t->name, "' has ", rows,
                                " rows, not a multiple of 2 x its ", perm->second, " heads"));
    }
    std::vector<uint8_t>& copy = (*owned_)[t->name];
    if (copy.empty()) {
      copy.resize(size_t(t->nbytes));
      un_permute_rows(t->data, rows, w.row_bytes(), perm->second, copy.data());
    }
    w.data = copy.data();
  }
  return w;
}

std::vector<float> WeightStore::gguf_vector(const std::string& name, int64_t n) const {
  auto it = gguf_map_.hf_to_gguf.find(name);
  const GgufTensor* t = it == gguf_map_.hf_to_gguf.end() ? nullptr : gguf_->find_tensor(it->second);
  if (t == nullptr) {
    throw FormatError(str_cat(gguf_->path(), ": tensor '",
                              it == gguf_map_.hf_to_gguf.end() ? name : it->second,
                              "' (expected shape [", n, "]) is missing"));
  }
  WeightFormat format;
  DType dtype;
  if (t->ne != std::vector<int64_t>{n} || !gguf_format(t->type, &format, &dtype) ||
      format != WeightFormat::kDense) {
    throw FormatError(str_cat(gguf_->path(), ": tensor '", t->name, "' is ",
                              gguf_type_name(t->type), " ", t->shape_string(),
                              ", expected F32, F16 or BF16 [", n, "]"));
  }
  std::vector<float> out(static_cast<size_t>(n));
  widen_rows_ref(WeightMatrix{dtype, t->data, 1, n}, 0, 1, out.data());
  auto perm = gguf_map_.permuted_heads.find(t->name);
  if (perm != gguf_map_.permuted_heads.end()) {  // a q/k bias, permuted like its matrix
    if (perm->second <= 0 || n % (2 * perm->second) != 0) {
      throw FormatError(str_cat(gguf_->path(), ": tensor '", t->name, "' has ", n,
                                " values, not a multiple of 2 x its ", perm->second, " heads"));
    }
    std::vector<float> permuted = out;
    un_permute_rows(reinterpret_cast<const uint8_t*>(permuted.data()), n, sizeof(float),
                    perm->second, reinterpret_cast<uint8_t*>(out.data()));
  }
  return out;
}

void un_permute_rows(const uint8_t* src, int64_t rows, int64_t row_bytes, int heads, uint8_t* dst) {
  const int64_t hd = rows / heads, half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < half; ++j) {
        std::memcpy(dst + (h * hd + i * half + j) * row_bytes,
                    src + (h * hd + 2 * j + i) * row_bytes, size_t(row_bytes));
      }
    }
  }
}

}  // namespace turbokv
