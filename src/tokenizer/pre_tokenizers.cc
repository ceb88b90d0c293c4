// tokenizer.json pre-tokenizers: Sequence, Split (regex or literal, all five behaviours,
// invert), ByteLevel (GPT-2 byte alphabet, optional GPT-2 regex), Metaspace, Whitespace,
// WhitespaceSplit, Digits.
#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/utf8.h"
#include "tokenizer/pipeline.h"

namespace turbokv {
namespace {

// The GPT-2 split regex that ByteLevel applies when use_regex is true.
constexpr char kByteLevelRegex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void split(std::vector<std::string>& pieces, bool first_segment) const override {
    for (const auto& step : steps_) step->split(pieces, first_segment);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 2);
    for (const std::string& piece : pieces) split_one(piece, out);
    pieces = std::move(out);
  }

 private:
  void split_one(std::string_view text, std::vector<std::string>& out) const {
    // Alternating spans of the text, each flagged whether it is a delimiter (a regex match,
    // or with invert a gap between matches).
    struct Span {
      size_t begin, end;
      bool delimiter;
    };
    std::vector<Span> spans;
    size_t last = 0;
    for (const auto& [begin, end] : pattern_.find_all(text)) {
      if (begin > last) spans.push_back({last, begin, invert_});
      spans.push_back({begin, end, !invert_});
      last = end;
    }
    if (last < text.size()) spans.push_back({last, text.size(), invert_});

    // Group spans into pieces exactly as HF's SplitDelimiterBehavior does.
    std::vector<std::pair<size_t, size_t>> groups;
    auto extend_last = [&](const Span& span, bool to_front) {
      if (groups.empty()) {
        groups.emplace_back(span.begin, span.end);
      } else if (to_front) {
        groups.back().first = span.begin;
      } else {
        groups.back().second = span.end;
      }
    };
    bool previous_delimiter = false;
    if (behavior_ == SplitBehavior::kMergedWithNext) {
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->delimiter && !previous_delimiter) {
          extend_last(*it, true);
        } else {
          groups.emplace_back(it->begin, it->end);
        }
        previous_delimiter = it->delimiter;
      }
      std::reverse(groups.begin(), groups.end());
    } else {
      for (const Span& span : spans) {
        if (behavior_ == SplitBehavior::kRemoved && span.delimiter) continue;
        const bool merge =
            (behavior_ == SplitBehavior::kMergedWithPrevious && span.delimiter &&
             !previous_delimiter) ||
            (behavior_ == SplitBehavior::kContiguous && span.delimiter == previous_delimiter);
        if (merge) {
          extend_last(span, false);
        } else {
          groups.emplace_back(span.begin, span.end);
        }
        previous_delimiter = span.delimiter;
      }
    }
    for (const auto& [begin, end] : groups) out.emplace_back(text.substr(begin, end - begin));
  }

  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      regex_.emplace(SplitPreTokenizer(Regex(kByteLevelRegex), SplitBehavior::kIsolated, false));
  }

  void split(std::vector<std::string>& pieces, bool) const override {
    if (add_prefix_space_) {
      for (std::string& piece : pieces) {
        if (piece.empty() || piece[0] != ' ') piece.insert(piece.begin(), ' ');
      }
    }
    if (regex_) regex_->split(pieces, false);
    const auto& alphabet = utf8::byte_to_unicode();
    std::string mapped;  // reused: assigning it back rarely allocates (short pieces fit SSO)
    for (std::string& piece : pieces) {
      mapped.clear();
      for (const char c : piece) mapped += alphabet[static_cast<unsigned char>(c)];
      piece.assign(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::optional<SplitPreTokenizer> regex_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)),
        prepend_(prepend),
        splitter_(Regex::literal(replacement_), SplitBehavior::kMergedWithNext, false),
        split_(split) {}

  void split(std::vector<std::string>& pieces, bool first_segment) const override {
    for (size_t i = 0; i < pieces.size(); ++i) {
      std::string replaced;
      for (const char c : pieces[i]) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      const bool prepend =
          prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && first_segment && i == 0);
      if (prepend && replaced.compare(0, replacement_.size(), replacement_) != 0) {
        replaced.insert(0, replacement_);
      }
      pieces[i] = std::move(replaced);
    }
    if (split_) splitter_.split(pieces, first_segment);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  SplitPreTokenizer splitter_;
  bool split_;
};

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  throw FormatError(str_cat("tokenizer.json: ", where, ".behavior '", name,
                            "' is not one of Removed, Isolated, MergedWithPrevious, "
                            "MergedWithNext, Contiguous"));
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", where);
  if (type == "Sequence") {
    return std::make_unique<SequencePreTokenizer>(
        json_sequence(j, "pretokenizers", where, make_pre_tokenizer));
  }
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        make_pattern(json_member(j, "pattern", where), where + ".pattern"),
        parse_behavior(json_string(j, "behavior", where), where),
        json_bool_or(j, "invert", false, where));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(json_bool_or(j, "add_prefix_space", true, where),
                                                   json_bool_or(j, "use_regex", true, where));
  }
  if (type == "Metaspace") {
    // Newer files carry prepend_scheme; older ones add_prefix_space.
    auto prepend = json_bool_or(j, "add_prefix_space", true, where)
                       ? MetaspacePreTokenizer::Prepend::kAlways
                       : MetaspacePreTokenizer::Prepend::kNever;
    const std::string scheme = json_string_or(j, "prepend_scheme", "", where);
    if (scheme == "first") prepend = MetaspacePreTokenizer::Prepend::kFirst;
    if (scheme == "never") prepend = MetaspacePreTokenizer::Prepend::kNever;
    if (scheme == "always") prepend = MetaspacePreTokenizer::Prepend::kAlways;
    return std::make_unique<MetaspacePreTokenizer>(
        json_string_or(j, "replacement", "\u2581", where), prepend,
        json_bool_or(j, "split", true, where));
  }
  if (type == "Whitespace") {
    return std::make_unique<SplitPreTokenizer>(Regex(R"(\w+|[^\w\s]+)"), SplitBehavior::kRemoved,
                                               true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<SplitPreTokenizer>(Regex(R"(\s+)"), SplitBehavior::kRemoved, false);
  }
  if (type == "Digits") {
    const bool individual = json_bool_or(j, "individual_digits", false, where);
    return std::make_unique<SplitPreTokenizer>(Regex(individual ? R"(\p{N})" : R"(\p{N}+)"),
                                               SplitBehavior::kIsolated, false);
  }
  throw Unsupported(str_cat("tokenizer.json: ", where, ": pre-tokenizer type '", type,
                            "' is not supported (supported: Sequence, Split, ByteLevel, Metaspace, "
                            "Whitespace, WhitespaceSplit, Digits)"));
}

}  // namespace turbokv
