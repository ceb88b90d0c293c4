// Model interface used by the engine, perplexity and the front ends. Implementations live
// per architecture family in this folder; Model::load picks one from config.json.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache.h"

namespace turbokv {

struct ModelInfo {
  std::string model_type;  // config.json "model_type"
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t max_position_embeddings = 0;
  std::vector<int32_t> eos_token_ids;  // config.json and generation_config.json
  std::optional<int32_t> bos_token_id;
};

class Model {
 public:
  virtual ~Model() = default;
  // Loads config.json and the (possibly sharded, possibly MLX-quantized) safetensors from dir,
  // or everything from dir when it names a GGUF file. Throws IoError, FormatError (naming the
  // file/tensor) or Unsupported (naming the architecture).
  static std::unique_ptr<Model> load(const std::string& dir);

  virtual const ModelInfo& info() const = 0;
  // One entry per layer, for the cache policy.
  virtual std::vector<LayerSpec> layer_specs() const = 0;

  // One sequence's piece of a batched forward pass. The chunk's tokens are at positions
  // caches->front()->size() onward and are appended to the caches.
  struct Chunk {
    const int32_t* tokens = nullptr;
    int n_tokens = 0;
    LayerCaches* caches = nullptr;
    float* logits = nullptr;  // [n_tokens, vocab] if all_logits else [vocab] (last token);
                              // null: no logits (a prefill piece whose outputs are not needed)
    bool all_logits = false;
  };
  // Runs every chunk; matmuls see the tokens of all chunks together.
  virtual void forward(std::span<const Chunk> chunks) const = 0;

  // Bytes of weights one decode step reads (every matrix once, the embedding only by row);
  // 0 when the model does not say.
  virtual int64_t decode_weight_bytes() const { return 0; }
};

// Throws InvalidArgument unless every chunk has one cache per layer, its tokens are in the
// vocabulary, and no two chunks share caches (what every forward checks first).
void check_chunks(std::span<const Model::Chunk> chunks, int num_layers, int vocab_size);

// Tokens per forward step through the matmuls: bounds activation memory during long prefills.
constexpr int kForwardStepTokens = 512;

// A contiguous piece of one chunk's tokens inside a forward step.
struct ChunkSlice {
  const Model::Chunk* chunk;
  int begin;  // first token of the chunk in this slice
  int count;
};
// The chunks cut into steps of at most max_step_tokens tokens, in order (a chunk may span
// steps). Every backend steps the same way, so step-dependent state (dynamic RoPE) agrees.
std::vector<std::vector<ChunkSlice>> split_into_steps(std::span<const Model::Chunk> chunks,
                                                      int max_step_tokens);
// The chunks cut at multiples of max_step_tokens from their own first tokens, the pieces packed
// into steps in order and never cut further: where a chunk's slices begin and end depends on
// that chunk alone (batch-invariant decoding).
std::vector<std::vector<ChunkSlice>> split_into_whole_steps(std::span<const Model::Chunk> chunks,
                                                            int max_step_tokens);

}  // namespace turbokv
