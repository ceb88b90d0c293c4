// tokenizer.json post-processors for single sequences: TemplateProcessing, Bert/Roberta
// (cls + text + sep), ByteLevel (offsets only: ids unchanged), Sequence.
#include "core/error.h"
#include "tokenizer/pipeline.h"

namespace turbokv {
namespace {

// A single-sequence template: special ids before and after the text.
class WrapProcessor final : public PostProcessor {
 public:
  WrapProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }
  std::vector<int32_t> prefix_ids() const override { return before_; }

 private:
  std::vector<int32_t> before_, after_;
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& step : steps_) step->process(ids);
  }
  std::vector<int32_t> prefix_ids() const override {
    std::vector<int32_t> prefix;
    for (const auto& step : steps_) {
      auto ids = step->prefix_ids();
      prefix.insert(prefix.begin(), ids.begin(), ids.end());
    }
    return prefix;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

int32_t special_id(const json& pair, const std::string& where) {
  if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) {
    throw FormatError(str_cat("tokenizer.json: ", where, " must be [token, id]"));
  }
  return pair[1].get<int32_t>();
}

std::unique_ptr<PostProcessor> make_template(const json& j, const std::string& where) {
  const json& single = json_member(j, "single", where);
  const json& specials = json_member(j, "special_tokens", where);
  if (!single.is_array())
    throw FormatError(str_cat("tokenizer.json: ", where, ".single must be an array"));
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item_where = str_cat(where, ".single[", i, "]");
    const json& item = single[i];
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    const std::string name = json_string(json_member(item, "SpecialToken", item_where), "id",
                                         item_where + ".SpecialToken");
    const json& special = json_member(specials, name.c_str(), where + ".special_tokens");
    const json& ids = json_member(special, "ids", where + ".special_tokens." + name);
    auto& target = seen_sequence ? after : before;
    for (const json& id : ids) {
      if (!id.is_number_integer()) {
        throw FormatError(str_cat("tokenizer.json: ", where, ".special_tokens.", name,
                                  ".ids must hold integers"));
      }
      target.push_back(id.get<int32_t>());
    }
  }
  return std::make_unique<WrapProcessor>(std::move(before), std::move(after));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_string(j, "type", where);
  if (type == "TemplateProcessing") return make_template(j, where);
  if (type == "ByteLevel")
    return std::make_unique<WrapProcessor>(std::vector<int32_t>{}, std::vector<int32_t>{});
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    return std::make_unique<WrapProcessor>(
        std::vector<int32_t>{special_id(json_member(j, "cls", where), where + ".cls")},
        std::vector<int32_t>{special_id(json_member(j, "sep", where), where + ".sep")});
  }
  if (type == "Sequence") {
    return std::make_unique<SequenceProcessor>(
        json_sequence(j, "processors", where, make_post_processor));
  }
  throw Unsupported(str_cat("tokenizer.json: ", where, ": post-processor type '", type,
                            "' is not supported (supported: TemplateProcessing, ByteLevel, "
                            "BertProcessing, RobertaProcessing, Sequence)"));
}

}  // namespace turbokv
