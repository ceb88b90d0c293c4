// `turbokv tokenize`: text -> token ids and token strings with a model's tokenizer.json.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "core/text_file.h"
#include "tokenizer/tokenizer.h"

namespace turbokv::cli {
namespace {

int run_tokenize(int argc, char** argv) {
  CLI::App app{"Tokenize text like the HF tokenizers library (prints ids and tokens)", "tokenize"};
  std::string model_dir, tokenizer_path, text, file;
  bool json_output = false, no_special = false;
  auto* model_opt =
      app.add_option("--model", model_dir, "model directory (default: shipped model)");
  auto* tokenizer_opt = app.add_option("--tokenizer", tokenizer_path, "a tokenizer.json file");
  model_opt->excludes(tokenizer_opt);
  auto* text_opt = app.add_option("--text", text, "text to tokenize");
  auto* file_opt = app.add_option("--file", file, "file whose contents to tokenize");
  text_opt->excludes(file_opt);
  app.add_flag("--json", json_output, "print one JSON object {ids, tokens}");
  app.add_flag("--no-special-tokens", no_special, "do not apply the post-processor (e.g. BOS)");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (text_opt->count() == 0 && file_opt->count() == 0) {
    throw InvalidArgument("one of --text or --file is required");
  }

  const auto tokenizer =
      tokenizer_path.empty()
          ? Tokenizer::from_model_dir(model_dir.empty() ? default_model_dir() : model_dir)
          : Tokenizer::from_file(tokenizer_path);
  const std::string input = file.empty() ? text : read_file(file);
  const std::vector<int32_t> ids = tokenizer->encode(input, !no_special);
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) tokens.push_back(tokenizer->id_to_token(id));

  if (json_output) {
    const nlohmann::ordered_json out = {{"ids", ids}, {"tokens", tokens}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    for (size_t i = 0; i < ids.size(); ++i) {
      std::printf("%d\t%s\n", ids[i],
                  nlohmann::json(tokens[i])
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                      .c_str());
    }
  }
  return 0;
}

}  // namespace

TURBOKV_COMMAND("tokenize", "text -> token ids with a model's tokenizer", run_tokenize);

}  // namespace turbokv::cli
