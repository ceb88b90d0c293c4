// The engine on the shipped model against HF transformers' greedy tokens
// (tests/fixtures/tinycode-llama-reference.safetensors): tiny prefill chunks and a tight token
// budget, with several identical requests batched together, must not change a single token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

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

// logprobs and top_logprobs of the first generated token against the log-softmax of the HF
// transformers logits of the prompt's last position (bf16 weights: logits agree within 2e-2).
TEST(EngineGolden, LogprobsEqualTransformersLogSoftmax) {
  const std::string root = TURBOKV_SOURCE_DIR;
  const auto ref =
      SafetensorsFile::open(root + "/tests/fixtures/tinycode-llama-reference.safetensors");
  std::vector<int32_t> prompt;
  for (int64_t id : SafetensorsFile::to_i64(ref.at("input_ids"))) prompt.push_back(id);
  const std::vector<float> logits = SafetensorsFile::to_f32(ref.at("logits"));  // [64, V]
  const size_t vocab = logits.size() / prompt.size();
  const float* last = logits.data() + (prompt.size() - 1) * vocab;
  double max_logit = *std::max_element(last, last + vocab), sum = 0;
  for (size_t i = 0; i < vocab; ++i) sum += std::exp(double(last[i]) - max_logit);
  auto want = [&](int32_t id) { return double(last[id]) - max_logit - std::log(sum); };
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return last[a] > last[b]; });

  auto engine = Engine::load(root + "/models/tinycode-llama");
  GenerateOptions o;
  o.max_tokens = 1;
  o.logprobs = true;
  o.top_logprobs = 5;
  auto stream = engine->submit(prompt, o);
  GenerationChunk chunk, first;
  while (stream->next(&chunk)) {
    if (chunk.token >= 0) first = chunk;
  }
  ASSERT_EQ(first.token, order[0]);  // greedy
  EXPECT_NEAR(first.logprob, want(first.token), 2e-2);
  ASSERT_EQ(first.top_logprobs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(first.top_logprobs[i].logprob, want(first.top_logprobs[i].token), 2e-2) << i;
    if (i > 0) {
      EXPECT_GE(first.top_logprobs[i - 1].logprob, first.top_logprobs[i].logprob);
    }
    // The same tokens as the reference's top 5, unless two are closer than the tolerance.
    EXPECT_NEAR(want(first.top_logprobs[i].token), want(order[i]), 2e-2) << i;
  }
}

}  // namespace
}  // namespace turbokv
