// tokenizer.json normalizers: Sequence, Prepend, Replace, NFC/NFD/NFKC/NFKD, Lowercase, Strip.
#include <optional>

#include "core/error.h"
#include "core/utf8.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/regex.h"

namespace turbokv {
namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override {
    return text.empty() ? text : prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string text) const override {
    return pattern_.replace_all(text, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(std::string form) : form_(std::move(form)) {}
  std::string normalize(std::string text) const override { return utf8::normalize(text, form_); }

 private:
  std::string form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string text) const override { return utf8::to_lower(text); }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t pos = begin;
        if (!utf8::is_space(utf8::next(text, pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t pos = start;
        if (!utf8::is_space(utf8::next(text, pos))) break;
        end = start;
      }
    }
    return text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

}  // namespace

// Pattern objects are {"String": "..."} (literal) or {"Regex": "..."}.
Regex make_pattern(const json& j, const std::string& where) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    return Regex::literal(j["String"].get<std::string>());
  }
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    try {
      return Regex(j["Regex"].get<std::string>());
    } catch (const FormatError& e) {
      throw FormatError(str_cat("tokenizer.json: ", where, ": ", e.what()));
    }
  }
  throw FormatError(
      str_cat("tokenizer.json: ", where, " must be {\"String\": ...} or {\"Regex\": ...}"));
}

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", where);
  if (type == "Sequence") {
    return std::make_unique<SequenceNormalizer>(
        json_sequence(j, "normalizers", where, make_normalizer));
  }
  if (type == "Prepend")
    return std::make_unique<PrependNormalizer>(json_string(j, "prepend", where));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(
        make_pattern(json_member(j, "pattern", where), where + ".pattern"),
        json_string(j, "content", where));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(type);
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_bool_or(j, "strip_left", true, where),
                                             json_bool_or(j, "strip_right", true, where));
  }
  throw Unsupported(str_cat("tokenizer.json: ", where, ": normalizer type '", type,
                            "' is not supported (supported: Sequence, Prepend, Replace, NFC, NFD, "
                            "NFKC, NFKD, Lowercase, Strip)"));
}

}  // namespace turbokv
