// `turbokv chat`: an interactive conversation rendered with the model's chat template. The
// history is kept between turns; /clear forgets it, /exit (or end of input) quits.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "cli/engine_flags.h"

namespace turbokv::cli {
namespace {

int run_chat(int argc, char** argv) {
  CLI::App app("Chat with the model (interactive; /clear forgets the history, /exit quits)",
               "chat");
  EngineFlags engine_flags;
  SamplingFlags sampling;
  std::string system;
  engine_flags.add_to(app);
  sampling.add_to(app);
  app.add_option("--system", system, "system message at the start of the conversation");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;

  auto engine = engine_flags.load();
  GenerateOptions options = sampling.options();
  options.stop_token_ids = engine->chat_stop_token_ids();
  const bool interactive = isatty(fileno(stdin)) != 0;
  std::vector<ChatMessage> history;
  auto reset = [&] {
    history.clear();
    if (!system.empty()) history.push_back({"system", system});
  };
  reset();
  if (interactive) std::fprintf(stderr, "chat: /clear forgets the history, /exit quits\n");

  std::string line;
  for (;;) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/clear") {
      reset();
      if (interactive) std::fprintf(stderr, "(history cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    history.push_back({"user", line});
    const auto tokens =
        engine->encode(engine->apply_chat_template(history), /*add_special_tokens=*/false);
    PrefillProgress progress(static_cast<int64_t>(tokens.size()));
    const auto reply = engine->generate(tokens, options, [&](const GenerationChunk& c) {
      progress.update(c);
      std::fwrite(c.text.data(), 1, c.text.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputs("\n", stdout);
    history.push_back({"assistant", reply.text});
  }
  return 0;
}

}  // namespace

TURBOKV_COMMAND("chat", "interactive chat with the model's chat template", run_chat);

}  // namespace turbokv::cli
