// `turbokv template`: renders a chat template (a model's, or a file) with variables from JSON,
// as transformers' apply_chat_template does. raise_exception in the template -> exit 1.
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "core/text_file.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace turbokv::cli {
namespace {

int run_template(int argc, char** argv) {
  CLI::App app{"Render a chat template with variables from a JSON file", "template"};
  std::string model_dir, template_path, vars_path;
  bool json_output = false;
  auto* model_opt = app.add_option(
      "--model", model_dir, "model directory whose chat_template to use (default: shipped model)");
  auto* template_opt = app.add_option("--template", template_path, "a Jinja2 template file");
  model_opt->excludes(template_opt);
  app.add_option("--vars", vars_path,
                 "JSON object: messages, tools, add_generation_prompt, bos_token, eos_token, ...")
      ->required();
  app.add_flag("--json", json_output, "print one JSON object {text}");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;

  auto vars = parse_json_located<nlohmann::ordered_json>(read_file(vars_path), vars_path);
  if (!vars.is_object()) {
    throw InvalidArgument(
        str_cat(vars_path, ": template variables must be a JSON object, got ", vars.type_name()));
  }
  std::string source;
  if (!template_path.empty()) {
    source = read_file(template_path);
  } else {
    const std::string dir = model_dir.empty() ? default_model_dir() : model_dir;
    const auto tokenizer = Tokenizer::from_model_dir(dir);
    const TokenizerConfig& config = tokenizer->config();
    if (config.chat_template.empty()) {
      throw InvalidArgument(
          str_cat("model '", dir, "' has no chat_template; pass --template FILE"));
    }
    source = config.chat_template;
    // transformers passes the special tokens to every template.
    if (!vars.contains("bos_token") && config.bos_token) vars["bos_token"] = *config.bos_token;
    if (!vars.contains("eos_token") && config.eos_token) vars["eos_token"] = *config.eos_token;
  }
  const std::string text = ChatTemplate::parse(source).render_ordered(vars);
  if (json_output) {
    const nlohmann::ordered_json out = {{"text", text}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  return 0;
}

}  // namespace

TURBOKV_COMMAND("template", "render a chat template with JSON variables", run_template);

}  // namespace turbokv::cli
