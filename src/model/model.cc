// Model::load: config.json -> ModelConfig (family dispatch), weights -> DecoderModel.
#include "model/model.h"

#include <algorithm>

#include "core/error.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/gguf_model.h"
#include "model/weights.h"

namespace turbokv {

std::unique_ptr<Model> Model::load(const std::string& dir) {
  if (is_gguf_file(dir)) {
    auto file = std::make_shared<const GgufFile>(GgufFile::open(dir));
    ModelConfig config = gguf_model_config(*file);
    GgufTensorMap map = gguf_tensor_map(*file, config);
    return std::make_unique<DecoderModel>(std::move(config),
                                          WeightStore::open_gguf(std::move(file), std::move(map)));
  }
  ModelConfig config = load_model_config(dir);
  return std::make_unique<DecoderModel>(std::move(config), WeightStore::open(dir));
}

void check_chunks(std::span<const Model::Chunk> chunks, int num_layers, int vocab_size) {
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Model::Chunk& chunk = chunks[c];
    if (chunk.caches == nullptr || int(chunk.caches->size()) != num_layers) {
      throw InvalidArgument(str_cat("chunk ", c, ": expected ", num_layers, " layer caches, got ",
                                    chunk.caches == nullptr ? 0 : chunk.caches->size()));
    }
    if (chunk.n_tokens < 0 || (chunk.n_tokens > 0 && chunk.tokens == nullptr)) {
      throw InvalidArgument(str_cat("chunk ", c, ": ", chunk.n_tokens, " tokens without data"));
    }
    for (size_t other = 0; other < c; ++other) {
      if (chunks[other].caches == chunk.caches) {
        throw InvalidArgument(str_cat("chunks ", other, " and ", c,
                                      " share their caches; each chunk must be its own sequence"));
      }
    }
    for (int i = 0; i < chunk.n_tokens; ++i) {
      if (chunk.tokens[i] < 0 || chunk.tokens[i] >= vocab_size) {
        throw InvalidArgument(str_cat("chunk ", c, ": token id ", chunk.tokens[i],
                                      " is outside the vocabulary [0, ", vocab_size, ")"));
      }
    }
  }
}

std::vector<std::vector<ChunkSlice>> split_into_steps(std::span<const Model::Chunk> chunks,
                                                      int max_step_tokens) {
  std::vector<std::vector<ChunkSlice>> steps;
  std::vector<ChunkSlice> step;
  int step_tokens = 0;
  for (const Model::Chunk& chunk : chunks) {
    for (int begin = 0; begin < chunk.n_tokens;) {
      const int count = std::min(chunk.n_tokens - begin, max_step_tokens - step_tokens);
      step.push_back(ChunkSlice{&chunk, begin, count});
      step_tokens += count;
      begin += count;
      if (step_tokens == max_step_tokens) {
        steps.push_back(std::move(step));
        step.clear();
        step_tokens = 0;
      }
    }
  }
  if (!step.empty()) steps.push_back(std::move(step));
  return steps;
}

std::vector<std::vector<ChunkSlice>> split_into_whole_steps(std::span<const Model::Chunk> chunks,
                                                            int max_step_tokens) {
  std::vector<std::vector<ChunkSlice>> steps;
  std::vector<ChunkSlice> step;
  int step_tokens = 0;
  for (const Model::Chunk& chunk : chunks) {
    for (int begin = 0; begin < chunk.n_tokens; begin += max_step_tokens) {
      const int count = std::min(chunk.n_tokens - begin, max_step_tokens);
      if (step_tokens + count > max_step_tokens) {
        steps.push_back(std::move(step));
        step.clear();
        step_tokens = 0;
      }
      step.push_back(ChunkSlice{&chunk, begin, count});
      step_tokens += count;
    }
  }
  if (!step.empty()) steps.push_back(std::move(step));
  return steps;
}

}  // namespace turbokv
