// Public C++ API for text generation: load a model directory (weights + tokenizer), then
// generate or stream text. One Engine serves many concurrent requests: a single engine thread
// batches every active sequence into each forward pass (continuous batching), and each request
// may choose its own KV-cache options (resolve_kv_options in turbokv/kv_options.h).
//
//   auto engine = turbokv::Engine::load("models/tinycode-llama");
//   turbokv::GenerateOptions opt;
//   opt.max_tokens = 64;
//   opt.kv = turbokv::KVOptions{};
//   opt.kv->kv_bits = 3.5;
//   auto result = engine->generate("def fibonacci(n):", opt);
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "turbokv/error.h"
#include "turbokv/kv_options.h"

namespace turbokv {

// Applied in this order: repetition penalty, presence and frequency penalties, logit bias,
// temperature, top-k, top-p, min-p. Ids the tokenizer does not have are never sampled.
struct SamplingOptions {
  double temperature = 0.0;         // 0: greedy (argmax, lowest id on ties)
  int top_k = 0;                    // 0: off
  double top_p = 1.0;               // nucleus mass in (0, 1]; 1: off
  double min_p = 0.0;               // drop tokens with p < min_p * p_max; 0: off
  double repetition_penalty = 1.0;  // > 0; 1: off (HF rule: logit/penalty if > 0 else *penalty)
  int repetition_context = 64;      // how many recent tokens (prompt included) the penalty sees
  // OpenAI's rule over the generated tokens so far (not the prompt): logit -= presence_penalty
  // if the token occurred, and -= frequency_penalty * its count. Both in [-2, 2]; 0: off.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  // Added to the logits of these ids, each in [-100, 100] (-100 in effect bans the token).
  std::vector<std::pair<int32_t, double>> logit_bias;
  uint64_t seed = 0;  // RNG seed of this request
};

class Session;

struct GenerateOptions {
  int max_tokens = 256;  // >= 1
  SamplingOptions sampling;
  std::vector<std::string> stop;        // stop strings: the text ends before the first match
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS ids
  bool ignore_eos = false;              // keep going past EOS ids (benchmarks, agreement)
  std::optional<KVOptions> kv;          // overrides the engine's default KV options
  // Teacher forcing: generated position i feeds forced_tokens[i] to the model instead of the
  // sampled token (chunks still report the sampled one): how often does a KV scheme pick the
  // reference's token given the reference's history?
  std::vector<int32_t> forced_tokens;
  // Run on this session's KV cache (see Session): the prompt's longest common prefix with the
  // session's tokens is not prefilled again, and the caches stay in the session afterwards.
  std::shared_ptr<Session> session;
  // Report each sampled token's log-probability, and the top_logprobs (0..20) most likely
  // tokens of its position: the model's log-softmax over the tokenizer's ids, before penalties,
  // bias and temperature.
  bool logprobs = false;
  int top_logprobs = 0;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

// The request queue is full (HTTP 429); the request may be retried later.
class Overloaded : public Error {
 public:
  using Error::Error;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled };
const char* finish_reason_name(FinishReason reason);  // "", "stop", "length", "cancelled"

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prompt_seconds = 0;      // from the first prefill chunk to the first sampled token
  double generation_seconds = 0;  // from the first sampled token to the last
  double prompt_tps = 0;          // prompt_tokens / prompt_seconds
  double generation_tps = 0;      // decode steps (sampled tokens - 1) / generation_seconds
  // The KV cache at the end: cached_tokens is what the caches hold (prompt + generated - 1: the
  // last sampled token is never fed back). kv_bytes is the caches' exact nbytes(), and
  // kv_bytes_dense the fp16 size of the same tokens:
  // cached_tokens * layers * kv_heads * head_dim * 2 (K and V) * 2 bytes.
  // Layers without per-token K/V (linear attention) keep a fixed-size recurrent state instead:
  // state_bytes, counted in neither kv_bytes nor kv_bytes_dense.
  int64_t cached_tokens = 0;
  size_t kv_bytes = 0;
  size_t kv_bytes_dense = 0;
  // Prompt tokens whose K/V came from the session or the prefix cache instead of a prefill
  // (OpenAI's usage.prompt_tokens_details.cached_tokens).
  int64_t prompt_cached_tokens = 0;
  size_t state_bytes = 0;
  ResolvedKV kv;  // the KV choice this request ran with
};

// One layer's cache as the cache policy chooses it for a ResolvedKV.
struct LayerCacheInfo {
  int layer = 0;
  std::string kind;         // "attention", "recurrent" (linear attention), "latent" (MLA), "shared"
  std::string cache;        // "turboquant", "uniform", "dense", "rotating", "recurrent", "shared"
  bool compressed = false;  // the scheme's codes (after quantized_kv_start when staged)
  int sliding_window = 0;
  int shared_with = -1;  // kind "shared": the layer whose cache it reads
};

// One streamed event. Token events carry the sampled token and the text that became final with
// it (may be empty: a partial UTF-8 character or a possible stop-string prefix is held back).
struct GenerationChunk {
  std::string text;
  int32_t token = -1;            // -1 for progress and final events without a new token
  float logprob = 0;             // GenerateOptions::logprobs: token's log-probability
  std::vector<TokenLogprob> top_logprobs;  // GenerateOptions::top_logprobs, most likely first
  int64_t prompt_processed = 0;  // prompt tokens prefilled so far (progress)
  bool done = false;             // the last chunk of the request
  FinishReason finish_reason = FinishReason::kNone;
  GenerationStats stats;  // up to date on every chunk; final on the done chunk
};

struct GenerationResult {
  std::string text;
  std::vector<int32_t> tokens;  // generated ids, the stopping EOS id excluded
  FinishReason finish_reason = FinishReason::kNone;
  GenerationStats stats;
};

enum class StreamWait { kChunk, kDone, kTimeout };

// A submitted request. Chunks are consumed by one thread at a time, in order.
class GenerationStream {
 public:
  virtual ~GenerationStream() = default;  // cancels the request if it is still running
  // Blocks until the next chunk. Returns false once the done chunk has been returned. Rethrows a
  // failure of the request (the engine keeps serving others).
  virtual bool next(GenerationChunk* chunk) = 0;
  // As next(), but waits at most timeout (kTimeout: no chunk yet, call again), so that a
  // caller can notice an interrupt while it waits.
  virtual StreamWait next_for(GenerationChunk* chunk, std::chrono::milliseconds timeout) = 0;
  virtual void cancel() = 0;
};

struct EngineOptions {
  std::string device = "cpu";  // "cpu" or "cuda" (the whole forward on the GPU)
  double kv_cache_gb = 0;      // cuda: GPU memory for the KV cache pool; 0: 90% of what is free
  // cuda: batch-invariant decoding, so a request's greedy text does not depend on the others
  // batched with it (slower at large decode batches; attention models with dense MLPs).
  bool batch_invariant = false;
  KVOptions kv;                // default KV options of every request (dense unless kv_bits)
  int max_sequences = 16;      // sequences decoded together; more requests wait in a queue
  int max_waiting = 256;       // queued requests beyond that are refused (Overloaded)
  // Prompt tokens per sequence per forward pass; at most max_batch_tokens - max_sequences + 1,
  // so that one prefill chunk always fits beside every other sequence's decode token. A
  // prompt is fed in chunks aligned to multiples of it whatever else runs, so what a cache
  // estimates from its first chunk does not depend on the other requests in the batch.
  int prefill_chunk = 256;
  int max_batch_tokens = 512;  // tokens per forward pass (decode tokens first, then prefill)
  // Automatic prefix cache (engine/prefix_cache.h): the KV of finished prompts kept for later
  // requests that start with the same tokens. Its memory budget in bytes: 0 turns it off; -1
  // picks a tenth of the physical memory, at most 8 GiB. Models with sliding-window layers do
  // not use it.
  int64_t prefix_cache_bytes = -1;
  // Tokens per cached block (16..4096), or 0 for the device's choice: 64 on the CPU, the KV
  // block of the GPU caches (256) on CUDA, whose whole blocks are then shared, not copied.
  int prefix_cache_block = 0;
};

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ModelSummary {
  std::string model_dir;
  std::string model_type;
  std::string device;  // where the forward runs: "cpu" or "cuda"
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int64_t context_length = 0;  // max_position_embeddings
};

// The KV pool of a device with one (the GPU's --kv-cache-gb), else all zero.
struct KVPoolUse {
  size_t capacity_bytes = 0;
  size_t used_bytes = 0;      // in blocks handed out (sequences and the prefix cache)
  size_t reserved_bytes = 0;  // promised to admitted requests
  int64_t blocks = 0;         // blocks handed out
  // The most that promises may total: capacity less what the pool keeps back (0: capacity).
  size_t promisable_bytes = 0;
};

struct EngineMetrics {
  int64_t requests_total = 0;  // submitted and accepted
  int64_t requests_failed = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generated_tokens_total = 0;
  int64_t active_sequences = 0;  // in the batch now
  int64_t waiting_requests = 0;  // queued for a batch slot
  size_t kv_bytes = 0;           // caches of the active sequences, now
  size_t kv_bytes_dense = 0;     // their fp16 equivalent
  size_t state_bytes = 0;        // their recurrent (linear-attention) states
  int64_t forward_passes = 0;
  // Prefix cache: lookups and hits (requests), prompt tokens restored instead of prefilled,
  // blocks evicted; blocks, tokens and bytes held now, their fp16 equivalent, the budget.
  int64_t prefix_cache_lookups = 0;
  int64_t prefix_cache_hits = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t prefix_cache_evictions = 0;
  int64_t prefix_cache_blocks = 0;
  int64_t prefix_cache_tokens = 0;
  size_t prefix_cache_bytes = 0;
  size_t prefix_cache_bytes_dense = 0;
  size_t prefix_cache_capacity_bytes = 0;
  // Prompt tokens reused from sessions (GenerateOptions::session) instead of prefilled.
  int64_t session_reused_tokens = 0;
  KVPoolUse kv_pool;
  // Requests that waited in the queue because the KV pool could not promise their bytes yet
  // (counted once per request).
  int64_t kv_pool_waits = 0;
};

// A conversation's KV cache kept between requests (llama.cpp's slots and --prompt-cache,
// mlx-lm's prompt cache). A request run on a session (GenerateOptions::session) starts from
// the longest common prefix of the session's tokens and its prompt: those tokens are not
// prefilled again. When it ends, its caches and tokens (prompt and generated) stay in the
// session, so the next request, or a process that loads the saved session, goes on exactly
// where it stopped. The KV settings are the session's, fixed when it is made or loaded. One
// request at a time uses a session. A common prefix shorter than the tokens the caches
// calibrated on (KVCache::calibration_tokens) is not reused: the request starts afresh.
class Session {
 public:
  virtual ~Session() = default;
  // The token history: prompt and generated tokens of the requests so far.
  virtual std::vector<int32_t> tokens() const = 0;
  // Tokens whose K/V the caches hold: the history's first cached_tokens() (the last sampled
  // token is not fed back until the next request).
  virtual int64_t cached_tokens() const = 0;
  virtual size_t kv_bytes() const = 0;        // the caches' exact nbytes()
  virtual size_t kv_bytes_dense() const = 0;  // fp16 K/V of the same tokens
  virtual const ResolvedKV& kv() const = 0;
  virtual bool busy() const = 0;  // a request is using it
  // Free-form text saved with the session (a chat front end keeps its messages here).
  virtual std::string metadata() const = 0;
  virtual void set_metadata(std::string text) = 0;
  // Forgets the tokens and caches. Throws InvalidArgument while busy.
  virtual void clear() = 0;
};

class Engine {
 public:
  // Loads the model and tokenizer from dir and starts the engine thread. Throws IoError,
  // FormatError, Unsupported; InvalidArgument for bad options (e.g. KV options).
  static std::unique_ptr<Engine> load(const std::string& model_dir,
                                      const EngineOptions& options = {});
  virtual ~Engine() = default;

  virtual const ModelSummary& summary() const = 0;
  virtual const EngineOptions& options() const = 0;
  // options().kv after the selection rules: what a request without its own KV options gets.
  virtual const ResolvedKV& default_kv() const = 0;

  virtual std::vector<int32_t> encode(const std::string& text,
                                      bool add_special_tokens = true) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Renders messages with the model's chat template (generation prompt appended). Throws
  // InvalidArgument when the model has no template or the template rejects the messages.
  virtual std::string apply_chat_template(const std::vector<ChatMessage>& messages) const = 0;
  // End-of-turn tokens of chat templates (<|im_end|>, <|eot_id|>, ...) this tokenizer has.
  virtual std::vector<int32_t> chat_stop_token_ids() const = 0;

  // Queues a request. Throws InvalidArgument for invalid options, an empty prompt or a prompt
  // that does not fit the context, and Overloaded when the queue is full.
  virtual std::unique_ptr<GenerationStream> submit(std::vector<int32_t> prompt_tokens,
                                                   const GenerateOptions& options) = 0;

  // submit + drain. on_chunk runs on the calling thread; returning false cancels.
  GenerationResult generate(std::vector<int32_t> prompt_tokens, const GenerateOptions& options,
                            const std::function<bool(const GenerationChunk&)>& on_chunk = {});
  GenerationResult generate(const std::string& prompt, const GenerateOptions& options,
                            const std::function<bool(const GenerationChunk&)>& on_chunk = {});

  virtual EngineMetrics metrics() const = 0;

  // An empty session with the engine's default KV options, or with kv.
  virtual std::shared_ptr<Session> new_session(const std::optional<KVOptions>& kv = {}) = 0;
  // Writes a session to a cache file (kv/cache_file.h: model identity, KV settings, tokens,
  // metadata, caches, CRC-32). Throws InvalidArgument while it is busy, IoError.
  virtual void save_session(Session& session, const std::string& path) = 0;
  // Reads a session written by save_session. With kv, the file must have been saved with the
  // settings these options resolve to. Throws IoError; FormatError for a file that is not a
  // cache file, truncated, corrupted or of another version; InvalidArgument for a file of
  // another model or with other KV settings (the message names both).
  virtual std::shared_ptr<Session> load_session(const std::string& path,
                                                const std::optional<KVOptions>& kv = {}) = 0;
  // The cache of every layer for a request resolved to kv (default_kv() for the default).
  virtual std::vector<LayerCacheInfo> cache_layers(const ResolvedKV& kv) const = 0;
};

}  // namespace turbokv
