// `turbokv chat`: an interactive conversation rendered with the model's chat template. The
// history is kept between turns; /clear forgets it, /exit (or end of input) quits. The
// conversation runs on one engine session, so each turn prefills only what is new since the
// last one (the user's message and the template's markers), not the whole history again.
// --prompt-cache FILE saves the session (KV cache, tokens and the messages) after every turn
// and resumes it when FILE exists.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/engine_flags.h"

namespace turbokv::cli {
namespace {

std::string messages_json(const std::vector<ChatMessage>& history) {
  nlohmann::json messages = nlohmann::json::array();
  for (const auto& m : history) messages.push_back({{"role", m.role}, {"content", m.content}});
  return nlohmann::json{{"messages", messages}}.dump();
}

// The messages a chat session saved in its metadata.
std::vector<ChatMessage> saved_messages(const std::string& metadata, const std::string& path) {
  std::vector<ChatMessage> history;
  if (metadata.empty()) return history;
  const auto j = nlohmann::json::parse(metadata, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("messages") || !j["messages"].is_array()) {
    throw FormatError(str_cat("'", path, "' holds no chat messages: not a chat session"));
  }
  for (const auto& m : j["messages"]) {
    if (!m.is_object() || !m.value("role", nlohmann::json()).is_string() ||
        !m.value("content", nlohmann::json()).is_string()) {
      throw FormatError(str_cat("'", path, "': malformed chat message ", m.dump()));
    }
    history.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return history;
}

int run_chat(int argc, char** argv) {
  CLI::App app("Chat with the model (interactive; /clear forgets the history, /exit quits)",
               "chat");
  EngineFlags engine_flags;
  SamplingFlags sampling;
  std::string system, prompt_cache;
  bool stats = false;
  engine_flags.add_to(app);
  sampling.add_to(app);
  app.add_option("--system", system, "system message at the start of the conversation");
  app.add_option("--prompt-cache", prompt_cache,
                 "cache file of the conversation: resumed when it exists, saved after each turn");
  app.add_flag("--stats", stats, "print each turn's token counts and speed on stderr");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;

  auto engine = engine_flags.load();
  PromptCache cache(*engine, prompt_cache, engine_flags.kv.options());
  GenerateOptions options = sampling.options();
  options.stop_token_ids = engine->chat_stop_token_ids();
  options.session = cache.shared();
  const bool interactive = isatty(fileno(stdin)) != 0;
  std::vector<ChatMessage> history;
  auto reset = [&] {
    history.clear();
    if (!system.empty()) history.push_back({"system", system});
    cache.session().clear();
    cache.session().set_metadata(messages_json(history));
  };
  if (cache.loaded()) {
    history = saved_messages(cache.session().metadata(), prompt_cache);
    if (interactive) {
      std::fprintf(stderr, "(resumed %zu messages, %lld cached tokens, from %s)\n", history.size(),
                   static_cast<long long>(cache.session().cached_tokens()), prompt_cache.c_str());
    }
  } else {
    reset();
  }
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
      cache.save();
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
    cache.session().set_metadata(messages_json(history));
    cache.save();
    if (stats) {
      const GenerationStats& s = reply.stats;
      std::fprintf(stderr, "[prompt %lld tokens, %lld cached | %lld generated, %.1f tok/s]\n",
                   static_cast<long long>(s.prompt_tokens),
                   static_cast<long long>(s.prompt_cached_tokens),
                   static_cast<long long>(s.generated_tokens), s.generation_tps);
    }
  }
  return 0;
}

}  // namespace

TURBOKV_COMMAND("chat", "interactive chat with the model's chat template", run_chat);

}  // namespace turbokv::cli
