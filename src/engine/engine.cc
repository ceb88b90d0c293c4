// Engine: the model, its tokenizer and chat template, and the scheduler's engine thread.
#include "turbokv/engine.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/gguf.h"
#include "backend/backend.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "kv/cache_file.h"
#include "kv/cache_policy.h"
#include "kv/kv_resolve.h"
#include "template/chat_template.h"

namespace turbokv {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "";
}

GenerationResult Engine::generate(std::vector<int32_t> prompt_tokens,
                                  const GenerateOptions& options,
                                  const std::function<bool(const GenerationChunk&)>& on_chunk) {
  auto stream = submit(std::move(prompt_tokens), options);
  GenerationResult result;
  GenerationChunk chunk;
  while (stream->next(&chunk)) {
    result.text += chunk.text;
    if (chunk.token >= 0) result.tokens.push_back(chunk.token);
    if (chunk.done) {
      result.finish_reason = chunk.finish_reason;
      result.stats = chunk.stats;
    }
    if (on_chunk && !on_chunk(chunk)) stream->cancel();
  }
  return result;
}

GenerationResult Engine::generate(const std::string& prompt, const GenerateOptions& options,
                                  const std::function<bool(const GenerationChunk&)>& on_chunk) {
  return generate(encode(prompt), options, on_chunk);
}

namespace {

DeviceOptions device_options(const EngineOptions& o) {
  return DeviceOptions{o.device, o.kv_cache_gb, o.batch_invariant};
}

class EngineImpl : public Engine {
 public:
  EngineImpl(const std::string& dir, const EngineOptions& options)
      : options_(options),
        loaded_(load_model(dir, device_options(options))),
        model_(loaded_.model.get()),
        tokenizer_(Tokenizer::from_model_dir(dir)) {
    const ModelInfo& info = model_->info();
    summary_.model_dir = dir;
    summary_.device = loaded_.device;
    summary_.model_type = info.model_type;
    summary_.num_layers = info.num_layers;
    summary_.num_kv_heads = info.num_kv_heads;
    summary_.head_dim = info.head_dim;
    summary_.vocab_size = info.vocab_size;
    summary_.context_length = info.max_position_embeddings;
    const auto& config = tokenizer_->config();
    if (!config.chat_template.empty()) chat_template_ = ChatTemplate::parse(config.chat_template);

    std::vector<int32_t> eos = info.eos_token_ids;
    for (int32_t id : config.eos_token_ids) {
      if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    }
    fingerprint_ = model_fingerprint(dir);
    model_tag_ = std::filesystem::path(dir).filename().string();
    if (model_tag_.empty())
      model_tag_ = std::filesystem::path(dir).parent_path().filename().string();
    EngineOptions resolved = options;
    if (resolved.prefix_cache_block == 0) resolved.prefix_cache_block = loaded_.prefix_block;
    scheduler_ = std::make_unique<Scheduler>(*model_, *tokenizer_, std::move(eos), resolved,
                                             loaded_.make_caches, loaded_.admission);
    scheduler_->start();
  }

  const ModelSummary& summary() const override { return summary_; }
  const EngineOptions& options() const override { return options_; }
  const ResolvedKV& default_kv() const override { return scheduler_->default_kv(); }

  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const override {
    return tokenizer_->encode(text, add_special_tokens);
  }
  std::string decode(std::span<const int32_t> ids) const override {
    return tokenizer_->decode(ids, /*skip_special_tokens=*/true);
  }

  std::string apply_chat_template(const std::vector<ChatMessage>& messages) const override {
    if (!chat_template_) {
      throw InvalidArgument(str_cat("the model in ", summary_.model_dir,
                                    " has no chat_template in tokenizer_config.json"));
    }
    nlohmann::json vars;
    vars["messages"] = nlohmann::json::array();
    for (const auto& m : messages) {
      vars["messages"].push_back({{"role", m.role}, {"content", m.content}});
    }
    vars["add_generation_prompt"] = true;
    const auto& config = tokenizer_->config();
    vars["bos_token"] = config.bos_token.value_or("");
    vars["eos_token"] = config.eos_token.value_or("");
    try {
      return chat_template_->render(vars);
    } catch (const TemplateError& e) {
      throw InvalidArgument(str_cat("the chat template rejected the messages: ", e.what()));
    }
  }

  std::vector<int32_t> chat_stop_token_ids() const override {
    std::vector<int32_t> ids;
    for (const char* token : {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"}) {
      if (auto id = tokenizer_->token_to_id(token); id && tokenizer_->is_special(*id)) {
        ids.push_back(*id);
      }
    }
    return ids;
  }

  std::unique_ptr<GenerationStream> submit(std::vector<int32_t> prompt_tokens,
                                           const GenerateOptions& options) override {
    return scheduler_->submit(std::move(prompt_tokens), options);
  }

  EngineMetrics metrics() const override { return scheduler_->metrics(); }

  std::shared_ptr<Session> new_session(const std::optional<KVOptions>& kv) override {
    return scheduler_->new_session(kv ? resolve_kv_options(*kv) : default_kv());
  }

  void save_session(Session& session, const std::string& path) override {
    auto* impl = dynamic_cast<SessionImpl*>(&session);
    if (impl == nullptr || impl->owner() != scheduler_.get()) {
      throw InvalidArgument("the session belongs to another engine");
    }
    impl->with_idle([&](const LayerCaches& caches, const std::vector<int32_t>& tokens,
                        const std::string& metadata) {
      const CacheFileInfo info{model_tag_, fingerprint_, impl->kv(), tokens, metadata};
      if (caches.empty()) {
        save_cache_file(path, info, scheduler_->make_caches(impl->kv()));
      } else {
        save_cache_file(path, info, caches);
      }
    });
  }

  std::shared_ptr<Session> load_session(const std::string& path,
                                        const std::optional<KVOptions>& kv) override {
    CacheFileReader file(path);
    const CacheFileInfo& info = file.info();
    if (info.model_fingerprint != fingerprint_) {
      throw InvalidArgument(str_cat("cache file '", path, "' belongs to another model ('",
                                    info.model_tag, "', fingerprint ", info.model_fingerprint,
                                    "); this engine runs '", model_tag_, "' (fingerprint ",
                                    fingerprint_, ")"));
    }
    if (kv) {
      const ResolvedKV wanted = resolve_kv_options(*kv);
      if (wanted != info.kv) {
        throw InvalidArgument(str_cat("cache file '", path, "' was saved with KV settings '",
                                      describe_kv(info.kv), "'; this run uses '",
                                      describe_kv(wanted), "'"));
      }
    }
    for (int32_t id : info.tokens) {
      if (id < 0 || id >= summary_.vocab_size) {
        throw FormatError(str_cat("cache file '", path, "': token id ", id,
                                  " is outside the vocabulary [0, ", summary_.vocab_size, ")"));
      }
    }
    LayerCaches caches;
    try {
      caches = scheduler_->make_caches(info.kv);
    } catch (const InvalidArgument& e) {
      throw FormatError(str_cat("cache file '", path, "' has unusable KV settings: ", e.what()));
    }
    file.load_caches(caches);
    auto session = scheduler_->new_session(info.kv);
    session->install(std::move(caches), info.tokens, info.metadata);
    return session;
  }

  std::vector<LayerCacheInfo> cache_layers(const ResolvedKV& kv) const override {
    const std::vector<LayerCachePlan> plan = plan_layer_caches(model_->layer_specs(), kv);
    std::vector<LayerCacheInfo> out;
    for (size_t i = 0; i < plan.size(); ++i) {
      const LayerCachePlan& p = plan[i];
      const bool compressed =
          p.kind == LayerCacheKind::kTurboQuant || p.kind == LayerCacheKind::kUniform;
      out.push_back(LayerCacheInfo{int(i), layer_state_kind_name(p.layer),
                                   layer_cache_kind_name(p.kind), compressed, p.window,
                                   p.shared_with});
    }
    return out;
  }

 private:
  EngineOptions options_;
  ModelSummary summary_;
  uint64_t fingerprint_ = 0;
  std::string model_tag_;
  LoadedModel loaded_;
  const Model* model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::unique_ptr<Scheduler> scheduler_;  // last: its thread stops before the model goes
};

}  // namespace

std::unique_ptr<Engine> Engine::load(const std::string& model_dir, const EngineOptions& options) {
  resolve_kv_options(options.kv);  // bad options fail before the model is read
  check_device(device_options(options));
  if (!std::filesystem::is_directory(model_dir) && !is_gguf_file(model_dir)) {
    throw IoError(str_cat("model '", model_dir,
                          "' is neither a model directory nor a GGUF file"));
  }
  return std::make_unique<EngineImpl>(model_dir, options);
}

}  // namespace turbokv
