// The engine on the shipped model against HF transformers' greedy tokens
// (tests/fixtures/tinycode-llama-reference.safetensors): tiny prefill chunks and a tight token
// budget, with several identical requests batched together, must not change a single token.
#include <gtest/gtest.h>

#include "core/safetensors.h"
#include "turbokv/engine.h"

namespace turbokv {
namespace {

TEST(EngineGolden, ChunkedBatchedGreedyEqualsTransformers) {
  const std::string root = TURBOKV_SOURCE_DIR;
  const auto ref =
      SafetensorsFile::open(root + "/tests/fixtures/tinycode-llama-reference.safetensors");
  std::vector<int32_t> prompt, want;
  for (int64_t id : SafetensorsFile::to_i64(ref.at("input_ids"))) prompt.push_back(id);
  for (int64_t id : SafetensorsFile::to_i64(ref.at("generated"))) want.push_back(id);

  EngineOptions options;
  options.prefill_chunk = 7;  // 64-token prompt: 10 chunks, the last one 1 token
  options.max_sequences = 3;
  options.max_batch_tokens = 12;  // prefill of later requests interleaves with decode
  auto engine = Engine::load(root + "/models/tinycode-llama", options);
  GenerateOptions o;
  o.max_tokens = static_cast<int>(want.size());
  o.ignore_eos = true;
  std::vector<std::unique_ptr<GenerationStream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(engine->submit(prompt, o));
  for (auto& stream : streams) {
    std::vector<int32_t> got;
    GenerationChunk chunk;
    while (stream->next(&chunk)) {
      if (chunk.token >= 0) got.push_back(chunk.token);
    }
    EXPECT_EQ(got, want);
  }
  const auto m = engine->metrics();
  EXPECT_EQ(m.generated_tokens_total, 4 * static_cast<int64_t>(want.size()));
}

}  // namespace
}  // namespace turbokv
