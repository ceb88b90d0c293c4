// Golden end-to-end checks against Hugging Face transformers: logits of the reference prompt
// within a stated tolerance, and the greedy continuation token for token (prompt prefill, then
// one token per decode step through the caches).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/model.h"
#include "test_util.h"
#include "tests/model/golden.h"

namespace turbokv {
namespace {

using testing::fixture;

struct Golden {
  std::string model_dir;
  std::string reference;
  float logits_tolerance;
};

void check_golden(const Golden& g) {
  std::unique_ptr<Model> model = Model::load(g.model_dir);
  testing::check_golden(*model, [&] { return testing::f32_caches(*model); }, g.reference,
                        g.logits_tolerance, g.model_dir);
}

class HfTinyGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTinyGolden, LogitsAndGreedyTokensMatchTransformers) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  check_golden({dir, dir + "/reference.safetensors", 1e-3f});
}

INSTANTIATE_TEST_SUITE_P(Families, HfTinyGolden,
                         ::testing::Values("llama", "qwen2", "qwen3", "mistral", "gemma3_text",
                                           "phi3", "qwen3_moe"));

// Hybrid linear attention (qwen3_5, and its MoE variant with a gated shared expert), Gemma 4
// (sliding/global head dims, KV-shared layers, per-layer inputs; keys-equal-values global layers
// with their own KV head count) and latent attention with a shared-expert MoE (deepseek_v3): fp32
// weights, logits within 1e-4 of transformers 5.17.
class HfTinyGoldenNewKinds : public ::testing::TestWithParam<const char*> {};

TEST_P(HfTinyGoldenNewKinds, LogitsAndGreedyTokensMatchTransformers) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  check_golden({dir, dir + "/reference.safetensors", 1e-4f});
}

INSTANTIATE_TEST_SUITE_P(Families, HfTinyGoldenNewKinds,
                         ::testing::Values("qwen3_5_text", "gemma4_text", "deepseek_v3",
                                           "gemma4_text_k_eq_v", "qwen3_5_moe_text"));

// transformers 5 runs gemma2 with SDPA attention by default, and SDPA skips
// attn_logit_softcapping (only the eager path applies it); the fixture was made that way.
// With the cap removed from config.json we must match it like every other family; with the
// cap (the architecture as trained, and our default) the logits move by about 1e-3 and the
// greedy tokens stay the same.
TEST(Gemma2Golden, MatchesTransformersSdpaWithoutAttentionSoftcap) {
  namespace fs = std::filesystem;
  const fs::path src = fixture("hf-tiny/gemma2");
  const fs::path dir =
      fs::temp_directory_path() / ("turbokv_gemma2_sdpa_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "generation_config.json"}) {
    fs::copy_file(src / f, dir / f, fs::copy_options::overwrite_existing);
  }
  nlohmann::json config = nlohmann::json::parse(std::ifstream(src / "config.json"));
  ASSERT_EQ(config["attn_logit_softcapping"], 50.0);
  config["attn_logit_softcapping"] = nullptr;
  std::ofstream(dir / "config.json") << config.dump();
  check_golden({dir.string(), (src / "reference.safetensors").string(), 1e-3f});
  fs::remove_all(dir);
}

TEST(Gemma2Golden, AttentionSoftcapMovesLogitsSlightly) {
  const std::string dir = fixture("hf-tiny/gemma2");
  check_golden({dir, dir + "/reference.safetensors", 2e-3f});
}

TEST(TinycodeGolden, LogitsAndGreedyTokensMatchTransformers) {
  check_golden({testing::repo_path("models/tinycode-llama"),
                fixture("tinycode-llama-reference.safetensors"), 2e-2f});
}

// A fixture's model and reference prompt, with the logits of one whole-prompt forward.
struct WholePrompt {
  std::unique_ptr<Model> model;
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [n, V]
  int V = 0, n = 0;
};

WholePrompt whole_prompt(const std::string& family) {
  WholePrompt w;
  const std::string dir = fixture("hf-tiny/" + family);
  w.model = Model::load(dir);
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  const std::vector<int64_t> ids64 = SafetensorsFile::to_i64(ref.at("input_ids"));
  w.ids.assign(ids64.begin(), ids64.end());
  w.V = w.model->info().vocab_size;
  w.n = int(w.ids.size());
  LayerCaches whole = testing::f32_caches(*w.model);
  w.logits.resize(size_t(w.n) * w.V);
  Model::Chunk one{w.ids.data(), w.n, &whole, w.logits.data(), true};
  w.model->forward({&one, 1});
  return w;
}

// The same prompt split into several chunks of one batched forward, and across steps, gives
// the logits of one whole-prompt forward.
TEST(BatchedForward, ChunksAndSplitPromptsAgreeWithOneSequence) {
  const WholePrompt w = whole_prompt("gemma2");
  const Model* model = w.model.get();
  const std::vector<int32_t>& ids = w.ids;
  const std::vector<float>& want = w.logits;
  const int V = w.V, n = w.n;

  // Sequence A: the prompt in two forwards (10 + 14 tokens); sequence B rides along in the
  // same calls with the whole prompt, last-token logits only.
  LayerCaches a = testing::f32_caches(*model), b = testing::f32_caches(*model);
  std::vector<float> got(size_t(n) * V), b_last(static_cast<size_t>(V));
  Model::Chunk first[] = {{ids.data(), 10, &a, got.data(), true},
                          {ids.data(), n, &b, b_last.data(), false}};
  model->forward(first);
  Model::Chunk second{ids.data() + 10, n - 10, &a, got.data() + size_t(10) * V, true};
  model->forward({&second, 1});
  // A prefill piece without logits still fills the caches: C sees 10 + 14 tokens.
  LayerCaches c_caches = testing::f32_caches(*model);
  std::vector<float> c_last(static_cast<size_t>(V));
  Model::Chunk c_first{ids.data(), 10, &c_caches, nullptr, false};
  model->forward({&c_first, 1});
  Model::Chunk c_rest{ids.data() + 10, n - 10, &c_caches, c_last.data(), false};
  model->forward({&c_rest, 1});
  for (int i = 0; i < V; ++i) ASSERT_NEAR(c_last[size_t(i)], want[size_t(n - 1) * V + i], 1e-4f);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << i;
  for (int i = 0; i < V; ++i) ASSERT_NEAR(b_last[size_t(i)], want[size_t(n - 1) * V + i], 1e-4f);
}

// Recurrent state, conv history, KV sharing and latent caches carry across forwards: a prompt
// fed as 10 + 14 tokens, or 20 + one token at a time, gives the logits of one forward.
class SplitPrompt : public ::testing::TestWithParam<const char*> {};

TEST_P(SplitPrompt, PiecesAgreeWithOneForward) {
  const WholePrompt w = whole_prompt(GetParam());
  const Model* model = w.model.get();
  const std::vector<int32_t>& ids = w.ids;
  const std::vector<float>& want = w.logits;
  const int V = w.V, n = w.n;
  for (const int first : {10, 20}) {
    LayerCaches caches = testing::f32_caches(*model);
    std::vector<float> got(size_t(n) * V);
    Model::Chunk head{ids.data(), first, &caches, got.data(), true};
    model->forward({&head, 1});
    const int step = first == 10 ? n - 10 : 1;
    for (int pos = first; pos < n; pos += step) {
      Model::Chunk rest{ids.data() + pos, step, &caches, got.data() + size_t(pos) * V, true};
      model->forward({&rest, 1});
    }
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-4f) << first << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(NewKinds, SplitPrompt,
                         ::testing::Values("qwen3_5_text", "gemma4_text", "deepseek_v3",
                                           "gemma4_text_k_eq_v", "qwen3_5_moe_text"));

TEST(BatchedForward, RejectsBadChunks) {
  std::unique_ptr<Model> model = Model::load(fixture("hf-tiny/llama"));
  LayerCaches caches = testing::f32_caches(*model), too_few;
  std::vector<float> logits(static_cast<size_t>(model->info().vocab_size));
  const int32_t ok[] = {1, 2}, bad[] = {1, 512};
  Model::Chunk out_of_vocab{bad, 2, &caches, logits.data(), false};
  EXPECT_THROW(model->forward({&out_of_vocab, 1}), InvalidArgument);
  Model::Chunk no_caches{ok, 2, &too_few, logits.data(), false};
  EXPECT_THROW(model->forward({&no_caches, 1}), InvalidArgument);
  Model::Chunk shared[] = {{ok, 2, &caches, logits.data(), false},
                           {ok, 2, &caches, logits.data(), false}};
  EXPECT_THROW(model->forward(shared), InvalidArgument);
  EXPECT_EQ(caches[0]->size(), 0);  // nothing ran
}

}  // namespace
}  // namespace turbokv
