// libFuzzer target: a model directory whose config.json is the input (and generation_config.json
// the part after a NUL byte, if any) over the hf-tiny llama weights. Model::load must end in a
// turbokv error or a model whose forward pass runs.
#include <cstring>
#include <filesystem>
#include <span>

#include "core/error.h"
#include "kv/cache_policy.h"
#include "model/model.h"
#include "fuzz_util.h"

namespace {

std::string model_dir() {
  const std::string dir = turbokv::fuzz::temp_path("model");
  std::filesystem::create_directories(dir);
  const std::filesystem::path weights = std::filesystem::path(dir) / "model.safetensors";
  std::filesystem::remove(weights);
  std::filesystem::create_symlink(turbokv::fuzz::fixture("hf-tiny/llama/model.safetensors"),
                                  weights);
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = model_dir();
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t config_size = nul ? static_cast<size_t>(nul - data) : size;
  turbokv::fuzz::write_file(dir + "/config.json", data, config_size);
  const std::string generation = dir + "/generation_config.json";
  if (nul) {
    turbokv::fuzz::write_file(generation, nul + 1, size - config_size - 1);
  } else {
    std::filesystem::remove(generation);
  }
  try {
    const auto model = turbokv::Model::load(dir);
    turbokv::LayerCaches caches = turbokv::make_layer_caches(
        model->layer_specs(), turbokv::ResolvedKV{}, turbokv::KVDType::kF32);
    const int32_t tokens[2] = {0, 1 % model->info().vocab_size};
    std::vector<float> logits(static_cast<size_t>(model->info().vocab_size));
    turbokv::Model::Chunk chunk{tokens, 2, &caches, logits.data(), false};
    model->forward(std::span<const turbokv::Model::Chunk>(&chunk, 1));
  } catch (const turbokv::Error&) {
  }
  return 0;
}
