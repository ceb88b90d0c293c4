// WeightStore (weights.h): opens single-file or sharded safetensors and checks every tensor
// the model asks for.
#include "model/weights.h"

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

WeightMatrix WeightStore::matrix(const std::string& name, int64_t rows, int64_t cols) const {
  const TensorView& t = tensor(name, {rows, cols});
  return WeightMatrix{t.dtype, t.data, rows, cols};
}

std::vector<float> WeightStore::vector(const std::string& name, int64_t n) const {
  return SafetensorsFile::to_f32(tensor(name, {n}));
}

}  // namespace turbokv
