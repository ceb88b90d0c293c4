// tokenizer.json loading, encode/decode, model-dir configuration and the streaming decoder.
#include "tokenizer/hf_tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "core/gguf.h"
#include "tokenizer/gguf_tokenizer.h"
#include "core/text_file.h"
#include "core/utf8.h"

namespace turbokv {

namespace {

// A special-token entry of tokenizer_config.json: a string, {"content": ...} or null.
std::optional<std::string> token_content(const nlohmann::ordered_json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

HfTokenizer::HfTokenizer(const json& root) {
  if (!root.is_object()) throw FormatError("tokenizer.json: the top level must be an object");
  const json& model = json_member(root, "model", "tokenizer.json");
  const std::string type = json_string_or(model, "type", "BPE", "model");
  if (type != "BPE") {
    throw Unsupported(
        str_cat("tokenizer.json: model type '", type, "' is not supported (only BPE)"));
  }
  model_ = std::make_unique<BpeModel>(model);

  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& list = root["added_tokens"];
    if (!list.is_array()) throw FormatError("tokenizer.json: added_tokens must be an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = str_cat("added_tokens[", i, "]");
      AddedToken token;
      const int64_t id = json_int_or(list[i], "id", -1, where);
      if (id < 0 || id > INT32_MAX) {
        throw FormatError(str_cat("tokenizer.json: ", where, ".id must be a non-negative integer"));
      }
      token.id = static_cast<int32_t>(id);
      token.content = json_string(list[i], "content", where);
      token.special = json_bool_or(list[i], "special", false, where);
      token.lstrip = json_bool_or(list[i], "lstrip", false, where);
      token.rstrip = json_bool_or(list[i], "rstrip", false, where);
      token.single_word = json_bool_or(list[i], "single_word", false, where);
      token.normalized = json_bool_or(list[i], "normalized", !token.special, where);
      added_.add(std::move(token));
    }
  }
  auto stage = [&](const char* key) -> const json& {
    static const json null_json;
    return root.contains(key) ? root[key] : null_json;
  };
  normalizer_ = make_normalizer(stage("normalizer"), "normalizer");
  pre_tokenizer_ = make_pre_tokenizer(stage("pre_tokenizer"), "pre_tokenizer");
  post_processor_ = make_post_processor(stage("post_processor"), "post_processor");
  decoder_ = make_decoder(stage("decoder"), "decoder");
  if (post_processor_) {
    config_.add_bos_token = !post_processor_->prefix_ids().empty();
  }
}

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  return std::make_unique<HfTokenizer>(read_json_file(path));
}

void HfTokenizer::load_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    const auto cfg =
        parse_json_located<nlohmann::ordered_json>(read_file(config_path), config_path.string());
    if (!cfg.is_object()) throw FormatError(str_cat(config_path.string(), ": must be an object"));
    if (cfg.contains("added_tokens_decoder") && cfg["added_tokens_decoder"].is_object()) {
      for (const auto& [id_text, entry] : cfg["added_tokens_decoder"].items()) {
        int32_t id = 0;
        try {
          id = std::stoi(id_text);
        } catch (const std::exception&) {
          throw FormatError(str_cat(config_path.string(), ": added_tokens_decoder key '", id_text,
                                    "' is not an integer id"));
        }
        if (added_.by_id(id) != nullptr || !entry.is_object()) continue;
        AddedToken token;
        token.id = id;
        token.content = token_content(entry).value_or("");
        auto flag = [&entry = entry](const char* key) {
          return entry.contains(key) && entry[key].is_boolean() && entry[key].get<bool>();
        };
        token.special = flag("special");
        token.lstrip = flag("lstrip");
        token.rstrip = flag("rstrip");
        token.single_word = flag("single_word");
        token.normalized = flag("normalized");
        added_.add(std::move(token));
      }
    }
    auto special = [&](const char* key) -> std::optional<std::string> {
      return cfg.contains(key) ? token_content(cfg[key]) : std::nullopt;
    };
    config_.bos_token = special("bos_token");
    config_.eos_token = special("eos_token");
    config_.pad_token = special("pad_token");
    config_.unk_token = special("unk_token");
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
      const bool wanted = cfg["add_bos_token"].get<bool>();
      const auto bos_id = config_.bos_token ? token_to_id(*config_.bos_token) : std::nullopt;
      const auto prefix = post_processor_ ? post_processor_->prefix_ids() : std::vector<int32_t>{};
      const bool processor_adds = bos_id && !prefix.empty() && prefix.front() == *bos_id;
      prepend_bos_ = wanted && bos_id && !processor_adds;
      config_.add_bos_token = wanted && bos_id.has_value();
    }
    if (cfg.contains("chat_template")) {
      const auto& tmpl = cfg["chat_template"];
      if (tmpl.is_string()) {
        config_.chat_template = tmpl.get<std::string>();
      } else if (tmpl.is_array()) {  // [{name, template}, ...]: the "default" one
        for (const auto& entry : tmpl) {
          if (entry.is_object() && entry.value("name", "") == "default" &&
              entry.contains("template") && entry["template"].is_string()) {
            config_.chat_template = entry["template"].get<std::string>();
          }
        }
      }
    }
  }
  // Newer transformers save the template next to the config as chat_template.jinja.
  const fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  if (config_.chat_template.empty() && fs::exists(jinja_path)) {
    config_.chat_template = read_file(jinja_path.string());
  }
  const fs::path generation_path = fs::path(dir) / "generation_config.json";
  if (fs::exists(generation_path)) {
    const json gen = read_json_file(generation_path.string());
    if (gen.is_object() && gen.contains("eos_token_id")) {
      const json& eos = gen["eos_token_id"];
      if (eos.is_number_integer()) {
        config_.eos_token_ids.push_back(eos.get<int32_t>());
      } else if (eos.is_array()) {
        for (const json& id : eos) {
          if (!id.is_number_integer()) {
            throw FormatError(str_cat(generation_path.string(),
                                      ": eos_token_id must hold integers, got ", id.dump()));
          }
          config_.eos_token_ids.push_back(id.get<int32_t>());
        }
      }
    }
  }
  if (config_.eos_token_ids.empty() && config_.eos_token) {
    if (auto id = token_to_id(*config_.eos_token)) config_.eos_token_ids.push_back(*id);
  }
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const size_t bad = utf8::find_invalid(text); bad != std::string_view::npos) {
    throw InvalidArgument(str_cat("text to tokenize is not valid UTF-8 (byte ", bad, " is 0x",
                                  std::hex, static_cast<int>(static_cast<unsigned char>(text[bad])),
                                  ")"));
  }
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;
  for (const auto& segment : added_.split(text, /*normalized_tokens=*/false)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    std::string part(text.substr(segment.begin, segment.end - segment.begin));
    if (normalizer_) part = normalizer_->normalize(std::move(part));
    for (const auto& inner : added_.split(part, /*normalized_tokens=*/true)) {
      if (inner.id >= 0) {
        ids.push_back(inner.id);
        continue;
      }
      pieces.clear();
      pieces.emplace_back(part, inner.begin, inner.end - inner.begin);
      if (pre_tokenizer_) pre_tokenizer_->split(pieces, segment.begin == 0 && inner.begin == 0);
      for (const std::string& piece : pieces) model_->encode_piece(piece, ids);
    }
  }
  if (add_special_tokens) {
    if (post_processor_) post_processor_->process(ids);
    if (prepend_bos_) ids.insert(ids.begin(), *token_to_id(*config_.bos_token));
  }
  return ids;
}

const std::string& HfTokenizer::token_string(int32_t id) const {
  if (const AddedToken* token = added_.by_id(id)) return token->content;
  const std::string* token = model_->id_to_token(id);
  if (token == nullptr) {
    throw InvalidArgument(
        str_cat("token id ", id, " is not in the vocabulary (0..", vocab_size() - 1, ")"));
  }
  return *token;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string& token = token_string(id);
    if (skip_special_tokens && is_special(id)) continue;
    tokens.push_back(token);
  }
  std::string text;
  if (decoder_) {
    for (const std::string& part : decoder_->decode_chain(std::move(tokens))) text += part;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text.append(i ? " " : "").append(tokens[i]);
  }
  return text;
}

int HfTokenizer::vocab_size() const {
  int32_t limit = model_->id_limit();
  for (const AddedToken& token : added_.tokens()) limit = std::max(limit, token.id + 1);
  return limit;
}

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.by_content(token)) return id;
  return model_->token_to_id(token);
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  return token_string(id);
}

bool HfTokenizer::is_special(int32_t id) const {
  const AddedToken* token = added_.by_id(id);
  return token != nullptr && token->special;
}

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& tokenizer_json) {
  return HfTokenizer::load(tokenizer_json);
}

std::unique_ptr<Tokenizer> Tokenizer::from_model_dir(const std::string& dir) {
  if (is_gguf_file(dir)) return gguf_tokenizer(GgufFile::open(dir));
  const auto path = std::filesystem::path(dir) / "tokenizer.json";
  if (!std::filesystem::exists(path)) {
    throw IoError(str_cat("model directory '", dir, "' has no tokenizer.json"));
  }
  auto tokenizer = HfTokenizer::load(path.string());
  tokenizer->load_model_config(dir);
  return tokenizer;
}

// Streaming: decode the window [prefix_offset_, end) and the part already emitted
// [prefix_offset_, read_offset_); the difference is new text once it does not end in U+FFFD
// (an incomplete UTF-8 sequence). Decoding a short window keeps each push O(window).
StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  const std::string before =
      tokenizer_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string now = tokenizer_.decode(all.subspan(prefix_offset_), skip_special_);
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  if (now.size() <= before.size() || now.ends_with(kReplacement) ||
      now.compare(0, before.size(), before) != 0) {
    return {};
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return now.substr(before.size());
}

std::string StreamDecoder::flush() {
  const std::span<const int32_t> all(ids_);
  const std::string before =
      tokenizer_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string now = tokenizer_.decode(all.subspan(prefix_offset_), skip_special_);
  prefix_offset_ = read_offset_ = ids_.size();
  return now.size() > before.size() ? now.substr(before.size()) : std::string();
}

}  // namespace turbokv
