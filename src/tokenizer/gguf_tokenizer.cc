// GGUF tokenizer metadata -> tokenizer.json pipeline (gguf_tokenizer.h).
#include "tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/hf_tokenizer.h"

namespace turbokv {
namespace {

// llama.cpp's token_type values.
constexpr int kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6;

// The split regex of each llama.cpp pre-tokenizer name (byte-level BPE models).
struct PreTokenizerRegex {
  const char* names[3];
  const char* regex;  // nullptr: GPT-2's (ByteLevel use_regex)
};

constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr PreTokenizerRegex kPreTokenizers[] = {
    {{"default", "gpt-2", "gpt2"}, nullptr},
    {{"llama-bpe", "llama3", "llama-v3"}, kLlama3Regex},
    {{"qwen2", "deepseek-r1-qwen", nullptr}, kQwen2Regex},
};

nlohmann::json byte_level_pre_tokenizer(const GgufFile& f, const std::string& pre) {
  std::string names;
  for (const PreTokenizerRegex& p : kPreTokenizers) {
    for (const char* name : p.names) {
      if (name == nullptr) continue;
      names += str_cat(names.empty() ? "" : ", ", name);
      if (pre != name) continue;
      if (p.regex == nullptr) {
        return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
      }
      return {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"},
                 {"pattern", {{"Regex", p.regex}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    }
  }
  throw Unsupported(str_cat(f.path(), ": pre-tokenizer 'tokenizer.ggml.pre' = '", pre,
                            "' is not supported (supported: ", names, ")"));
}

// SentencePiece-style merges from scores: every split of a normal token into two vocabulary
// tokens, ranked by the merged token's score (higher first), then by its id.
nlohmann::json merges_from_scores(const std::vector<std::string>& tokens,
                                  const std::vector<double>& scores,
                                  const std::vector<double>& types) {
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t i = 0; i < tokens.size(); ++i) id_of.emplace(tokens[i], int32_t(i));
  struct Merge {
    double score;
    int32_t id;
    size_t split;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!types.empty() && types[i] != 1) continue;
    const std::string& t = tokens[i];
    for (size_t k = 1; k < t.size(); ++k) {
      auto left = id_of.find(t.substr(0, k)), right = id_of.find(t.substr(k));
      if (left != id_of.end() && right != id_of.end()) {
        merges.push_back({scores[i], int32_t(i), k});
      }
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return a.score != b.score ? a.score > b.score : a.id < b.id;
  });
  nlohmann::json out = nlohmann::json::array();
  for (const Merge& m : merges) {
    const std::string& t = tokens[size_t(m.id)];
    out.push_back({t.substr(0, m.split), t.substr(m.split)});
  }
  return out;
}

}  // namespace

nlohmann::json gguf_tokenizer_json(const GgufFile& f) {
  const std::optional<std::string> model = f.get_string("tokenizer.ggml.model");
  if (!model) throw FormatError(str_cat(f.path(), ": metadata 'tokenizer.ggml.model' is missing"));
  if (*model != "gpt2" && *model != "llama") {
    throw Unsupported(str_cat(f.path(), ": tokenizer model 'tokenizer.ggml.model' = '", *model,
                              "' is not supported (supported: gpt2, llama)"));
  }
  const std::vector<std::string>* tokens = f.get_strings("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->empty()) {
    throw FormatError(str_cat(f.path(), ": metadata 'tokenizer.ggml.tokens' is missing or empty"));
  }
  const std::vector<double> no_numbers;
  const std::vector<double>* types_ptr = f.get_numbers("tokenizer.ggml.token_type");
  const std::vector<double>& types = types_ptr ? *types_ptr : no_numbers;
  if (!types.empty() && types.size() != tokens->size()) {
    throw FormatError(str_cat(f.path(), ": metadata 'tokenizer.ggml.token_type' has ", types.size(),
                              " entries, expected one per token (", tokens->size(), ")"));
  }
  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < tokens->size(); ++i) {
    const int type = types.empty() ? 1 : int(types[i]);
    if (type == kControl || type == kUserDefined) {
      added.push_back({{"id", i},
                       {"content", (*tokens)[i]},
                       {"special", type == kControl},
                       {"normalized", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"single_word", false}});
    }
    if (!vocab.contains((*tokens)[i])) vocab[(*tokens)[i]] = i;
  }
  nlohmann::json root;
  root["added_tokens"] = added;
  nlohmann::json bpe = {
      {"type", "BPE"}, {"vocab", vocab}, {"fuse_unk", false}, {"byte_fallback", false}};
  if (*model == "gpt2") {
    const std::vector<std::string>* merges = f.get_strings("tokenizer.ggml.merges");
    if (merges == nullptr) {
      throw FormatError(str_cat(f.path(),
                                ": metadata 'tokenizer.ggml.merges' is missing (a gpt2 "
                                "tokenizer needs its merges)"));
    }
    nlohmann::json pairs = nlohmann::json::array();
    for (size_t i = 0; i < merges->size(); ++i) {
      const std::string& m = (*merges)[i];
      const size_t space = m.find(' ', 1);
      if (space == std::string::npos) {
        throw FormatError(str_cat(f.path(), ": metadata 'tokenizer.ggml.merges' entry ", i, " '", m,
                                  "' is not two tokens separated by a space"));
      }
      pairs.push_back({m.substr(0, space), m.substr(space + 1)});
    }
    bpe["merges"] = pairs;
    root["normalizer"] = nullptr;
    root["pre_tokenizer"] =
        byte_level_pre_tokenizer(f, f.get_string("tokenizer.ggml.pre").value_or("default"));
    root["decoder"] = {{"type", "ByteLevel"}};
  } else {
    const std::vector<double>* scores = f.get_numbers("tokenizer.ggml.scores");
    if (scores == nullptr || scores->size() != tokens->size()) {
      throw FormatError(str_cat(f.path(), ": metadata 'tokenizer.ggml.scores' has ",
                                scores ? scores->size() : 0, " entries, expected one per token (",
                                tokens->size(), ")"));
    }
    bpe["merges"] = merges_from_scores(*tokens, *scores, types);
    bpe["byte_fallback"] = true;
    bpe["fuse_unk"] = true;
    for (size_t i = 0; i < types.size(); ++i) {
      if (int(types[i]) == kUnknown) {
        bpe["unk_token"] = (*tokens)[i];
        break;
      }
    }
    if (!bpe.contains("unk_token")) {
      if (auto unk = f.get_int("tokenizer.ggml.unknown_token_id");
          unk && *unk >= 0 && size_t(*unk) < tokens->size()) {
        bpe["unk_token"] = (*tokens)[size_t(*unk)];
      }
    }
    nlohmann::json steps = nlohmann::json::array();
    if (f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true)) {
      steps.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    }
    steps.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    root["normalizer"] = {{"type", "Sequence"}, {"normalizers", steps}};
    root["pre_tokenizer"] = nullptr;
    nlohmann::json decoders = nlohmann::json::array();
    decoders.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}});
    decoders.push_back({{"type", "ByteFallback"}});
    decoders.push_back({{"type", "Fuse"}});
    if (f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true)) {
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    }
    root["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  }
  root["model"] = bpe;
  root["post_processor"] = nullptr;
  return root;
}

std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& f) {
  auto tokenizer = std::make_unique<HfTokenizer>(gguf_tokenizer_json(f));
  const std::vector<std::string>& tokens = *f.get_strings("tokenizer.ggml.tokens");
  auto token_of = [&](const char* key) -> std::optional<std::string> {
    const std::optional<int64_t> id = f.get_int(key);
    if (!id) return std::nullopt;
    if (*id < 0 || size_t(*id) >= tokens.size()) {
      throw FormatError(str_cat(f.path(), ": metadata '", key, "' is ", *id,
                                ", outside the vocabulary [0, ", tokens.size(), ")"));
    }
    return tokens[size_t(*id)];
  };
  TokenizerConfig config;
  config.bos_token = token_of("tokenizer.ggml.bos_token_id");
  config.eos_token = token_of("tokenizer.ggml.eos_token_id");
  config.pad_token = token_of("tokenizer.ggml.padding_token_id");
  config.unk_token = token_of("tokenizer.ggml.unknown_token_id");
  const bool is_llama = f.get_string("tokenizer.ggml.model") == "llama";
  config.add_bos_token =
      f.get_bool("tokenizer.ggml.add_bos_token").value_or(is_llama) && config.bos_token;
  config.chat_template = f.get_string("tokenizer.chat_template").value_or("");
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (auto id = f.get_int(key);
        id && std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), int32_t(*id)) ==
                  config.eos_token_ids.end()) {
      config.eos_token_ids.push_back(int32_t(*id));
    }
  }
  const bool prepend = config.add_bos_token;
  tokenizer->set_config(std::move(config), prepend);
  return tokenizer;
}

}  // namespace turbokv
