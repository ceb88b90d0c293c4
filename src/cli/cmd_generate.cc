// `turbokv generate`: one prompt in, text out (streamed, or one JSON object with --json).
// --compare-dense runs the prompt greedily with the dense cache and with the KV flags, prints both
// outputs, their position-by-position agreement, and the teacher-forced agreement (the quantized
// cache fed the dense tokens, picking the dense model's next token or not).
// --prompt-cache FILE keeps the KV cache and tokens in FILE: a later run whose prompt starts the
// same skips prefilling that part, and --continue goes on from the saved tokens (the prompt, if
// any, appended), producing what the first process would have produced next.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/engine_flags.h"
#include "kv/kv_resolve.h"

namespace turbokv::cli {
namespace {

struct GenerateFlags {
  EngineFlags engine;
  SamplingFlags sampling;
  std::string prompt, system, prompt_cache;
  bool chat = false, json = false, ignore_eos = false, compare_dense = false, resume = false;
};

std::vector<int32_t> prompt_tokens(const Engine& engine, const GenerateFlags& f) {
  if (!f.chat) return engine.encode(f.prompt);
  std::vector<ChatMessage> messages;
  if (!f.system.empty()) messages.push_back({"system", f.system});
  messages.push_back({"user", f.prompt});
  return engine.encode(engine.apply_chat_template(messages), /*add_special_tokens=*/false);
}

void print_stats(const GenerationStats& s) {
  std::fprintf(
      stderr,
      "\nprompt: %lld tokens (%lld cached), %.1f tok/s | generation: %lld tokens, %.1f "
      "tok/s | KV %s: %zu bytes for %lld tokens, dense fp16 %zu bytes (%.3fx)\n",
      static_cast<long long>(s.prompt_tokens), static_cast<long long>(s.prompt_cached_tokens),
      s.prompt_tps, static_cast<long long>(s.generated_tokens), s.generation_tps,
      kv_scheme_name(s.kv.scheme), s.kv_bytes, static_cast<long long>(s.cached_tokens),
      s.kv_bytes_dense, s.kv_bytes_dense ? double(s.kv_bytes) / double(s.kv_bytes_dense) : 0.0);
}

// The cache policy per layer: {"layer", "kind", "cache", "compressed"[, "shared_with"]}.
nlohmann::json cache_layers_json(const Engine& engine, const ResolvedKV& kv) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerCacheInfo& l : engine.cache_layers(kv)) {
    nlohmann::json e = {
        {"layer", l.layer}, {"kind", l.kind}, {"cache", l.cache}, {"compressed", l.compressed}};
    if (l.sliding_window > 0) e["sliding_window"] = l.sliding_window;
    if (l.shared_with >= 0) e["shared_with"] = l.shared_with;
    layers.push_back(e);
  }
  return layers;
}

nlohmann::json stats_json(const GenerationStats& s) {
  nlohmann::json j = {{"prompt_tokens", s.prompt_tokens},
                      {"generated_tokens", s.generated_tokens},
                      {"prompt_tps", s.prompt_tps},
                      {"generation_tps", s.generation_tps},
                      {"cached_tokens", s.cached_tokens},
                      {"kv_bytes", s.kv_bytes},
                      {"kv_bytes_dense", s.kv_bytes_dense},
                      {"state_bytes", s.state_bytes},
                      {"kv_scheme", kv_scheme_name(s.kv.scheme)},
                      {"prompt_cached_tokens", s.prompt_cached_tokens}};
  if (s.kv.scheme != KVScheme::kDense) {
    j["kv_key_bits"] = s.kv.key_bits;
    j["kv_value_bits"] = s.kv.value_bits;
  }
  return j;
}

int compare_with_dense(Engine& engine, const GenerateFlags& f) {
  GenerateOptions o = f.sampling.options();
  if (o.sampling.temperature != 0) {
    throw InvalidArgument("--compare-dense compares greedy outputs: use --temperature 0");
  }
  if (engine.default_kv().scheme == KVScheme::kDense) {
    throw InvalidArgument("--compare-dense needs a quantized KV cache, e.g. --kv-bits 3.5");
  }
  o.ignore_eos = true;  // both runs produce exactly max_tokens tokens
  const auto tokens = prompt_tokens(engine, f);
  GenerateOptions dense_options = o;
  dense_options.kv = KVOptions{};
  const auto dense = engine.generate(tokens, dense_options);
  const auto quant = engine.generate(tokens, o);
  int64_t agree = 0, first_divergence = -1;
  for (size_t i = 0; i < dense.tokens.size() && i < quant.tokens.size(); ++i) {
    if (dense.tokens[i] == quant.tokens[i]) {
      ++agree;
    } else if (first_divergence < 0) {
      first_divergence = static_cast<int64_t>(i);
    }
  }
  // Teacher forcing: the quantized run fed the dense tokens; does it pick the same next token?
  GenerateOptions forced_options = o;
  forced_options.forced_tokens = dense.tokens;
  const auto forced = engine.generate(tokens, forced_options);
  int64_t forced_agree = 0;
  for (size_t i = 0; i < dense.tokens.size() && i < forced.tokens.size(); ++i) {
    forced_agree += dense.tokens[i] == forced.tokens[i];
  }
  const size_t n = dense.tokens.size();
  const double agreement = n ? double(agree) / double(n) : 0.0;
  const double forced_agreement = n ? double(forced_agree) / double(n) : 0.0;
  if (f.json) {
    nlohmann::json j = {{"prompt", f.prompt},
                        {"dense_text", dense.text},
                        {"kv_text", quant.text},
                        {"tokens", n},
                        {"agreeing_tokens", agree},
                        {"agreement", agreement},
                        {"first_divergence", first_divergence},
                        {"teacher_forced_agreeing_tokens", forced_agree},
                        {"teacher_forced_agreement", forced_agreement},
                        {"kv", stats_json(quant.stats)},
                        {"kv_layers", cache_layers_json(engine, quant.stats.kv)}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("prompt: %s\n--- dense ---\n%s\n--- %s K%g/V%g ---\n%s\n---\n", f.prompt.c_str(),
              dense.text.c_str(), kv_scheme_name(quant.stats.kv.scheme), quant.stats.kv.key_bits,
              quant.stats.kv.value_bits, quant.text.c_str());
  std::printf(
      "free-running token agreement: %lld/%zu (%.3f), first divergence at token %lld\n"
      "teacher-forced top-1 agreement (quantized cache fed the dense tokens): %lld/%zu (%.3f)\n",
      static_cast<long long>(agree), n, agreement, static_cast<long long>(first_divergence),
      static_cast<long long>(forced_agree), n, forced_agreement);
  return 0;
}

int run_generate(int argc, char** argv) {
  CLI::App app("Generate text from a prompt", "generate");
  GenerateFlags f;
  f.engine.add_to(app);
  f.sampling.add_to(app);
  CLI::Option* prompt =
      app.add_option("--prompt", f.prompt, "the prompt text (required unless --continue)");
  app.add_flag("--chat", f.chat, "wrap the prompt as a user message in the chat template");
  app.add_option("--system", f.system, "system message (with --chat)");
  app.add_flag("--json", f.json, "print one JSON object with the text and statistics");
  app.add_flag("--ignore-eos", f.ignore_eos, "generate max-tokens tokens even past EOS");
  app.add_flag("--compare-dense", f.compare_dense,
               "greedy output with the dense cache and with the KV flags, and token agreement");
  app.add_option("--prompt-cache", f.prompt_cache,
                 "cache file: reuse the KV of its tokens when the prompt starts with them, and "
                 "save the KV and tokens there after");
  app.add_flag("--continue", f.resume,
               "go on from the tokens saved in --prompt-cache (--prompt, if given, is appended)");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (!f.system.empty() && !f.chat) throw InvalidArgument("--system needs --chat");
  if (prompt->count() == 0 && !f.resume) throw InvalidArgument("--prompt is required");
  if (f.resume && (f.prompt_cache.empty() || f.chat)) {
    throw InvalidArgument("--continue needs --prompt-cache FILE and does not take --chat");
  }
  if (f.compare_dense && !f.prompt_cache.empty()) {
    throw InvalidArgument("--compare-dense does not take --prompt-cache");
  }

  auto engine = f.engine.load();
  if (f.compare_dense) return compare_with_dense(*engine, f);

  PromptCache cache(*engine, f.prompt_cache, f.engine.kv.options());
  GenerateOptions options = f.sampling.options();
  options.ignore_eos = f.ignore_eos;
  options.session = cache.shared();
  if (f.chat) options.stop_token_ids = engine->chat_stop_token_ids();
  std::vector<int32_t> tokens;
  if (f.resume) {
    if (cache.session().tokens().empty()) {
      throw InvalidArgument(str_cat("--continue: '", f.prompt_cache, "' holds no saved tokens"));
    }
    tokens = cache.session().tokens();
    if (!f.prompt.empty()) {
      const auto more = engine->encode(f.prompt, /*add_special_tokens=*/false);
      tokens.insert(tokens.end(), more.begin(), more.end());
    }
  } else {
    tokens = prompt_tokens(*engine, f);
  }
  PrefillProgress progress(static_cast<int64_t>(tokens.size()));
  const auto result = engine->generate(tokens, options, [&](const GenerationChunk& c) {
    progress.update(c);
    if (!f.json && !c.text.empty()) {
      std::fwrite(c.text.data(), 1, c.text.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  cache.save();
  if (f.json) {
    nlohmann::json j = stats_json(result.stats);
    j["kv_layers"] = cache_layers_json(*engine, result.stats.kv);
    j["text"] = result.text;
    j["tokens"] = result.tokens;
    j["finish_reason"] = finish_reason_name(result.finish_reason);
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n");
    print_stats(result.stats);
  }
  return 0;
}

}  // namespace

TURBOKV_COMMAND("generate", "generate text from a prompt", run_generate);

}  // namespace turbokv::cli
