// Model weights: the safetensors files of a model directory (one model.safetensors, or shards
// listed by model.safetensors.index.json), or one GGUF file, memory-mapped; tensors are handed
// out under their Hugging Face names as WeightMatrix views in their stored form (dense dtype,
// GGUF blocks, MLX affine codes with scales and biases) after their type and shape are checked.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/safetensors.h"
#include "kernels/cpu/matmul.h"

namespace turbokv {

// How the tensors of a GGUF file map to Hugging Face names (gguf_model.h builds it).
struct GgufTensorMap {
  std::map<std::string, std::string> hf_to_gguf;
  // GGUF matrices whose rows llama.cpp's converter permuted for its RoPE (interleaved pairs),
  // with the head count of the permutation; the store undoes it (see un_permute_rows).
  std::map<std::string, int> permuted_heads;
};

class WeightStore {
 public:
  // Throws IoError naming a missing file (model.safetensors or a shard), FormatError naming a
  // malformed/truncated file or an index entry whose tensor is not in its shard. MLX quantized
  // checkpoints (<name>.weight U32 codes with <name>.scales and <name>.biases) are read with
  // config.json's "quantization" (per-module overrides, false for unquantized modules).
  static WeightStore open(const std::string& dir);
  // A GGUF file whose tensors are named by map.
  static WeightStore open_gguf(std::shared_ptr<const GgufFile> file, GgufTensorMap map);

  bool has(const std::string& name) const;
  // A [rows, cols] matrix: F32/F16/BF16, an MLX affine triple, or a GGUF F32/F16/BF16/Q8_0/
  // Q4_0/Q5_0/Q4_K/Q6_K tensor. Throws FormatError naming the tensor and its file when it is
  // missing, has another type, or another shape.
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) const;
  // Matrix `index` of a stacked [count, rows, cols] dense tensor (F32/F16/BF16), e.g. one expert
  // of fused expert weights; same checks, InvalidArgument for an index outside [0, count).
  WeightMatrix stacked_matrix(const std::string& name, int64_t count, int64_t index, int64_t rows,
                              int64_t cols) const;
  // A [n] vector widened to f32 (norm weights, biases); same checks.
  std::vector<float> vector(const std::string& name, int64_t n) const;
  // Any small safetensors tensor of the given shape widened to f32, row-major (e.g.
  // conv1d.weight).
  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape) const;
  // Bytes of all tensors held (dense, blocks, codes, scales).
  int64_t total_bytes() const;

 private:
  const TensorView& tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  WeightMatrix affine_matrix(const std::string& name, const TensorView& codes, int64_t rows,
                             int64_t cols) const;
  WeightMatrix gguf_matrix(const std::string& name, int64_t rows, int64_t cols) const;
  std::vector<float> gguf_vector(const std::string& name, int64_t n) const;

  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<const TensorView*, const SafetensorsFile*>> tensors_;
  nlohmann::json quantization_;  // config.json "quantization" (MLX), null when absent
  std::string config_path_;
  std::shared_ptr<const GgufFile> gguf_;
  GgufTensorMap gguf_map_;
  // Un-permuted copies of GGUF q/k matrices, by GGUF name (node addresses are stable).
  std::shared_ptr<std::map<std::string, std::vector<uint8_t>>> owned_ =
      std::make_shared<std::map<std::string, std::vector<uint8_t>>>();
};

// Rows of a matrix written by llama.cpp's converter for q/k: within each of `heads` heads of
// hd rows, row 2j + i holds the original row i·hd/2 + j. Writes the original order.
void un_permute_rows(const uint8_t* src, int64_t rows, int64_t row_bytes, int heads, uint8_t* dst);

}  // namespace turbokv
