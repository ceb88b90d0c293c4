// Model weights: the safetensors files of a model directory (one model.safetensors, or shards
// listed by model.safetensors.index.json), memory-mapped; tensors are handed out as
// WeightMatrix views in their stored dtype after their dtype and shape are checked.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "kernels/cpu/matmul.h"

namespace turbokv {

class WeightStore {
 public:
  // Throws IoError naming a missing file (model.safetensors or a shard), FormatError naming a
  // malformed/truncated file or an index entry whose tensor is not in its shard.
  static WeightStore open(const std::string& dir);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // A [rows, cols] F32/F16/BF16 matrix. Throws FormatError naming the tensor and its file
  // when it is missing, has another dtype, or another shape.
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) const;
  // A [n] vector widened to f32 (norm weights, biases); same checks.
  std::vector<float> vector(const std::string& name, int64_t n) const;

 private:
  const TensorView& tensor(const std::string& name, const std::vector<int64_t>& shape) const;

  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<const TensorView*, const SafetensorsFile*>> tensors_;
};

}  // namespace turbokv
