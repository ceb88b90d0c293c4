// Tokenizers from GGUF metadata: each fixture tokenizer.json written as the tokenizer.ggml.*
// keys llama.cpp's converter writes (tokens, token types, merges or SentencePiece scores,
// pre-tokenizer name) must give the HF `tokenizers` ids and text of tokenizer-cases.json.
// Unknown pre-tokenizer names and tokenizer models are Unsupported, naming the value.
#include "tokenizer/gguf_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/gguf.h"
#include "core/text_file.h"
#include "tests/common/gguf_writer.h"

namespace turbokv {
namespace {

namespace fs = std::filesystem;
using testing::GgufWriter;

const std::string kRepo = TURBOKV_SOURCE_DIR;
const std::string kFixtures = kRepo + "/tests/fixtures/tokenizers/";

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("turbokv_ggtok_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// tokenizer.json -> GGUF tokenizer metadata. SentencePiece-style (byte_fallback) models get
// scores that reproduce the merge order: a token made by merge r scores -r.
GgufWriter gguf_from_tokenizer_json(const nlohmann::json& t, const std::string& pre) {
  const nlohmann::json& model = t["model"];
  std::map<int, std::string> by_id;
  for (const auto& [token, id] : model["vocab"].items()) by_id[id.get<int>()] = token;
  std::map<int, bool> special;
  for (const auto& a : t["added_tokens"]) {
    by_id[a["id"].get<int>()] = a["content"];
    special[a["id"].get<int>()] = a["special"];
  }
  const bool spm = model.value("byte_fallback", false);
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;
  std::map<std::string, float> score_of;
  if (spm) {
    int rank = 0;
    for (const auto& m : model["merges"]) {
      const std::string merged = m[0].get<std::string>() + m[1].get<std::string>();
      score_of.emplace(merged, -float(rank++));
    }
  }
  for (int id = 0; id < int(by_id.rbegin()->first) + 1; ++id) {
    const std::string token = by_id.count(id) ? by_id[id] : "<unused" + std::to_string(id) + ">";
    tokens.push_back(token);
    int type = 1;
    if (special.count(id)) type = special[id] ? 3 : 4;
    if (spm && token.size() == 6 && token.rfind("<0x", 0) == 0) type = 6;
    if (spm && model.contains("unk_token") && model["unk_token"] == token) type = 2;
    types.push_back(type);
    scores.push_back(score_of.count(token) ? score_of[token] : -1e9f);
  }
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", spm ? "llama" : "gpt2");
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_i32s("tokenizer.ggml.token_type", types);
  if (spm) {
    w.add_f32s("tokenizer.ggml.scores", scores);
    w.add_bool("tokenizer.ggml.add_bos_token", false);
  } else {
    std::vector<std::string> merges;
    for (const auto& m : model["merges"]) {
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
    w.add_strings("tokenizer.ggml.merges", merges);
    w.add_string("tokenizer.ggml.pre", pre);
  }
  return w;
}

struct Case {
  const char* name;
  const char* json;
  const char* pre;
};

class GgufTokenizerCases : public ::testing::TestWithParam<Case> {};

TEST_P(GgufTokenizerCases, IdsAndTextEqualHf) {
  const nlohmann::json t = read_json_file(kRepo + "/" + GetParam().json);
  const std::string path = temp_path(std::string(GetParam().name) + ".gguf");
  gguf_from_tokenizer_json(t, GetParam().pre).write(path);
  const auto tokenizer = Tokenizer::from_model_dir(path);
  fs::remove(path);
  std::ifstream in(kFixtures + "tokenizer-cases.json");
  const nlohmann::json cases = nlohmann::json::parse(in).at(GetParam().name);
  ASSERT_GT(cases.size(), 20u);
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer->encode(text), ids) << GetParam().name << ": " << text;
    EXPECT_EQ(tokenizer->decode(ids), c.at("decoded").get<std::string>()) << text;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GgufTokenizerCases,
    ::testing::Values(Case{"tinycode", "models/tinycode-llama/tokenizer.json", "qwen2"},
                      Case{"llama3style", "tests/fixtures/tokenizers/llama3style-tokenizer.json",
                           "llama-bpe"},
                      Case{"spmstyle", "tests/fixtures/tokenizers/spmstyle-tokenizer.json", ""}));

TEST(GgufTokenizerErrors, UnknownPreTokenizerAndModelAreUnsupported) {
  const nlohmann::json t = read_json_file(kRepo + "/models/tinycode-llama/tokenizer.json");
  const std::string path = temp_path("pre.gguf");
  gguf_from_tokenizer_json(t, "jais-unknown").write(path);
  try {
    Tokenizer::from_model_dir(path);
    ADD_FAILURE() << "no error";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("'jais-unknown'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("qwen2"), std::string::npos) << e.what();
  }
  GgufWriter w;
  w.add_string("tokenizer.ggml.model", "bert");
  w.write(path);
  EXPECT_THROW(Tokenizer::from_model_dir(path), Unsupported);
  fs::remove(path);
}

}  // namespace
}  // namespace turbokv
