// Tokenizers against the HF `tokenizers` reference
// (tests/fixtures/tokenizers/tokenizer-cases.json): ids and decoded text for tinycode (byte-level
// BPE), llama3style and spmstyle (byte fallback); streaming decode against the full decode;
// malformed tokenizer.json errors with locations.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text_file.h"
#include "tokenizer/hf_tokenizer.h"

namespace turbokv {
namespace {

const std::string kRepo = TURBOKV_SOURCE_DIR;
const std::string kFixtures = kRepo + "/tests/fixtures/tokenizers/";
const std::string kModelDir = kRepo + "/models/tinycode-llama";

nlohmann::json load_cases() {
  std::ifstream in(kFixtures + "tokenizer-cases.json");
  return nlohmann::json::parse(in);
}

std::unique_ptr<Tokenizer> load_named(const std::string& name) {
  if (name == "tinycode") return Tokenizer::from_model_dir(kModelDir);
  return Tokenizer::from_file(kFixtures + name + "-tokenizer.json");
}

class FixtureCases : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureCases, IdsAndDecodedTextEqualHf) {
  const auto cases = load_cases().at(GetParam());
  ASSERT_GT(cases.size(), 20u);
  const auto tokenizer = load_named(GetParam());
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    const auto expected_ids = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer->encode(text), expected_ids) << "text: " << text;
    EXPECT_EQ(tokenizer->decode(expected_ids), c.at("decoded").get<std::string>())
        << "text: " << text;
  }
}

// Pushing ids one by one never yields a partial UTF-8 sequence and concatenates to decode().
TEST_P(FixtureCases, StreamDecoderMatchesFullDecode) {
  const auto tokenizer = load_named(GetParam());
  const nlohmann::json cases = load_cases();  // a range-for would not keep the temporary alive
  for (const auto& c : cases.at(GetParam())) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    StreamDecoder stream(*tokenizer, /*skip_special_tokens=*/false);
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string piece = stream.push(id);
      EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << c.at("text");
      streamed += piece;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, tokenizer->decode(ids)) << c.at("text");
  }
}

INSTANTIATE_TEST_SUITE_P(Hf, FixtureCases,
                         ::testing::Values("tinycode", "llama3style", "spmstyle"));

// The fixture ids split emoji and CJK characters across byte-level / byte-fallback tokens; the
// stream must hold them back until the character is complete.
TEST(StreamDecoder, HoldsBackSplitCharacters) {
  const auto tinycode = load_named("tinycode");
  const std::vector<int32_t> robot = {795, 97, 244};  // "🤖" in three byte-level tokens
  StreamDecoder stream(*tinycode);
  EXPECT_EQ(stream.push(robot[0]), "");
  EXPECT_EQ(stream.push(robot[1]), "");
  EXPECT_EQ(stream.push(robot[2]), "\xF0\x9F\xA4\x96");
  EXPECT_EQ(stream.flush(), "");

  const auto spm = load_named("spmstyle");
  const auto ids = spm->encode("\xC3\x84");  // "Ä": ▁ then <0xC3> <0x84>
  ASSERT_EQ(ids, (std::vector<int32_t>{415, 198, 135}));
  StreamDecoder spm_stream(*spm, /*skip_special_tokens=*/false);
  std::string out = spm_stream.push(ids[0]);
  EXPECT_EQ(spm_stream.push(ids[1]), "");
  out += spm_stream.push(ids[2]);
  EXPECT_EQ(out + spm_stream.flush(), spm->decode(ids));
}

TEST(Tokenizer, ModelDirConfig) {
  const auto tokenizer = load_named("tinycode");
  const TokenizerConfig& config = tokenizer->config();
  EXPECT_EQ(config.eos_token, "<|endoftext|>");
  EXPECT_FALSE(config.bos_token.has_value());
  EXPECT_FALSE(config.add_bos_token);
  EXPECT_EQ(config.eos_token_ids, std::vector<int32_t>{8189});
  EXPECT_NE(config.chat_template.find("<|im_start|>"), std::string::npos);
  EXPECT_TRUE(tokenizer->is_special(8190));
  EXPECT_FALSE(tokenizer->is_special(7043));
  EXPECT_EQ(tokenizer->token_to_id("<|im_end|>"), 8191);
  EXPECT_EQ(tokenizer->id_to_token(8191), "<|im_end|>");
  EXPECT_EQ(tokenizer->vocab_size(), 8192);
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{8190, 2790, 8191}, true), "user");
}

// A model dir whose template is in chat_template.jinja and whose eos ids are a list.
TEST(Tokenizer, ModelDirTemplateFileAndEosList) {
  const auto dir = std::filesystem::temp_directory_path() / "turbokv_tokenizer_model_dir";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kFixtures + "llama3style-tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<|eot_id|>",
             "add_bos_token": true})";
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [4097, 4100]})";
  std::ofstream(dir / "chat_template.jinja") << "{{ bos_token }}";
  const auto tokenizer = Tokenizer::from_model_dir(dir.string());
  EXPECT_EQ(tokenizer->config().chat_template, "{{ bos_token }}");
  EXPECT_EQ(tokenizer->config().eos_token_ids, (std::vector<int32_t>{4097, 4100}));
  EXPECT_EQ(tokenizer->config().bos_token, "<|begin_of_text|>");
  // add_bos_token without a post-processor that adds it: BOS (id 4096) is prepended.
  EXPECT_TRUE(tokenizer->config().add_bos_token);
  EXPECT_EQ(tokenizer->encode("Hello world"),
            (std::vector<int32_t>{4096, 39, 555, 361, 332, 266, 3127}));
  EXPECT_EQ(tokenizer->encode("Hello world", false),
            (std::vector<int32_t>{39, 555, 361, 332, 266, 3127}));
}

TEST(Tokenizer, BadInputIsATypedError) {
  const auto tokenizer = load_named("tinycode");
  EXPECT_THROW(tokenizer->encode("bad \xFF byte"), InvalidArgument);
  EXPECT_THROW(tokenizer->decode(std::vector<int32_t>{99999}), InvalidArgument);
  EXPECT_THROW(tokenizer->id_to_token(-1), InvalidArgument);
}

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

std::string error_of(const std::string& tokenizer_json) {
  const std::string path = write_temp("turbokv_bad_tokenizer.json", tokenizer_json);
  try {
    Tokenizer::from_file(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Tokenizer, MalformedJsonNamesItsLocation) {
  const std::string message =
      error_of("{\n  \"model\": {\"type\": \"BPE\",\n    \"vocab\": {\"a\" 1}}}");
  EXPECT_NE(message.find("malformed JSON at byte 47 (line 3, column 19)"), std::string::npos)
      << message;
  EXPECT_THROW(Tokenizer::from_file(write_temp("t.json", "{\"model\": [}")), FormatError);
}

TEST(Tokenizer, StructuralErrorsNameTheBadEntry) {
  EXPECT_NE(error_of(R"({"version": "1.0"})").find("tokenizer.json.model is missing"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})")
                .find("model.merges[0] (a + b) uses a token that is not in the vocab"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})")
                .find("model.merges[0] must be"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model": {"type": "WordPiece", "vocab": {}}})").find("'WordPiece'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                          "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"},
                                            "behavior": "Isolated"}})")
                .find("tokenizer.json: pre_tokenizer.pattern: invalid regex '(a'"),
            std::string::npos);
  // A small file naming a huge id: a clear error instead of gigabytes of empty entries.
  EXPECT_NE(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2000000000},
                                   "merges": []}})")
                .find("model.vocab id 2000000000 is far past its 2 entries"),
            std::string::npos);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), IoError);
}

// Merges in the older "a b" string form give the same tokenizer as the [a, b] list form.
TEST(Tokenizer, StringAndListMergesAgree) {
  std::ifstream in(kFixtures + "llama3style-tokenizer.json");
  nlohmann::json root = nlohmann::json::parse(in);
  HfTokenizer list_form(root);
  for (auto& merge : root["model"]["merges"]) {
    merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  }
  HfTokenizer string_form(root);
  const nlohmann::json cases = load_cases();
  for (const auto& c : cases.at("llama3style")) {
    EXPECT_EQ(string_form.encode(c.at("text").get<std::string>()),
              list_form.encode(c.at("text").get<std::string>()));
  }
}

// An added token with normalized=true is matched in the normalized text ("▁world" after the
// Prepend/Replace normalizer); with normalized=false only in the raw text, where it is absent.
// Expected ids: the HF fixture ids of "Hello world" ([415, 300, 553, 552 | 415, 3189, 336, 328],
// no merge across the boundary) with the second word replaced by the added token.
TEST(Tokenizer, NormalizedAddedTokensMatchAfterNormalization) {
  std::ifstream in(kFixtures + "spmstyle-tokenizer.json");
  nlohmann::json root = nlohmann::json::parse(in);
  root["added_tokens"].push_back({{"id", 4096},
                                  {"content", "\u2581world"},
                                  {"single_word", false},
                                  {"lstrip", false},
                                  {"rstrip", false},
                                  {"normalized", true},
                                  {"special", false}});
  EXPECT_EQ(HfTokenizer(root).encode("Hello world"),
            (std::vector<int32_t>{415, 300, 553, 552, 4096}));
  root["added_tokens"].back()["normalized"] = false;
  EXPECT_EQ(HfTokenizer(root).encode("Hello world"),
            (std::vector<int32_t>{415, 300, 553, 552, 415, 3189, 336, 328}));
}

// Metaspace pre-tokenizer/decoder and a TemplateProcessing BOS on a hand-made vocabulary; the
// expected ids follow HF's rules by hand: "ab ab" -> "▁ab▁ab" -> pieces "▁ab" "▁ab"; in "▁ab"
// the merge "▁ a" (rank 0) beats "a b" (rank 1), then "▁a b" gives "▁ab". Split is
// MergedWithNext, so "a  b" -> "▁a" "▁" "▁b".
TEST(Tokenizer, MetaspaceAndTemplateProcessing) {
  const nlohmann::json root = nlohmann::json::parse(R"({
    "model": {"type": "BPE", "vocab": {"<s>": 0, "\u2581": 1, "a": 2, "b": 3, "\u2581a": 4,
                                       "ab": 5, "\u2581ab": 6},
              "merges": ["\u2581 a", "a b", "\u2581a b"]},
    "added_tokens": [{"id": 0, "content": "<s>", "special": true}],
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                      "split": true},
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}}],
                       "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
    "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                "split": true}})");
  HfTokenizer tokenizer(root);
  EXPECT_EQ(tokenizer.encode("ab ab"), (std::vector<int32_t>{0, 6, 6}));
  EXPECT_EQ(tokenizer.encode("ab ab", false), (std::vector<int32_t>{6, 6}));
  EXPECT_EQ(tokenizer.encode("a  b", false), (std::vector<int32_t>{4, 1, 1, 3}));
  EXPECT_TRUE(tokenizer.config().add_bos_token);
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{0, 6, 6}), "<s> ab ab");
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{0, 6, 6}, true), "ab ab");
}

// The per-piece cache returns what the plain BPE computes.
TEST(Tokenizer, CachedEqualsUncached) {
  auto tokenizer = HfTokenizer::load(kModelDir + "/tokenizer.json");
  const std::string source = read_file(kRepo + "/src/tokenizer/bpe.cc");
  const auto cached = tokenizer->encode(source);
  const auto again = tokenizer->encode(source);
  tokenizer->set_cache_enabled(false);
  EXPECT_EQ(tokenizer->encode(source), cached);
  EXPECT_EQ(again, cached);
}

}  // namespace
}  // namespace turbokv
