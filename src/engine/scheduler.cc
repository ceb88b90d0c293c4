// The engine thread's step loop: admission, batch building (decode first, then prefill chunks
// within the token budget), one batched forward, sampling and stop handling per sequence, and
// the per-request mailboxes that GenerationStream reads.
#include "engine/scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/stop_strings.h"
#include "kv/cache_file.h"
#include "kv/kv_resolve.h"

namespace turbokv {

using Clock = std::chrono::steady_clock;

size_t dense_kv_bytes(const std::vector<LayerSpec>& layers, int64_t tokens) {
  size_t per_token = 0;
  for (const auto& l : layers) {
    // A KV-shared layer stores nothing; a recurrent state holds no tokens (kv_heads 0).
    if (l.kind == LayerStateKind::kShared) continue;
    per_token += size_t(l.kv_heads) * l.head_dim * 2 /*K,V*/ * 2;
  }
  return per_token * static_cast<size_t>(tokens);
}

struct Scheduler::Request {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  GenerateOptions options;
  ResolvedKV kv;
  std::shared_ptr<SessionImpl> session;  // acquired by submit(), released when the request ends
  std::atomic<bool> cancelled{false};
  size_t kv_promised = 0;     // engine thread: the pool bytes promised at admission
  bool kv_waited = false;     // engine thread: counted in kv_pool_waits

  std::mutex mu;  // guards the mailbox below
  std::condition_variable cv;
  std::deque<GenerationChunk> chunks;
  std::exception_ptr error;

  void post(GenerationChunk chunk) {
    {
      std::lock_guard<std::mutex> lock(mu);
      chunks.push_back(std::move(chunk));
    }
    cv.notify_one();
  }
  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      error = std::move(e);
    }
    cv.notify_one();
  }
};

struct Scheduler::Sequence {
  Sequence(std::shared_ptr<Request> r, LayerCaches c, const Tokenizer& tokenizer,
           std::span<const int32_t> masked_ids)
      : req(std::move(r)),
        caches(std::move(c)),
        sampler(req->options.sampling, masked_ids),
        decoder(tokenizer, /*skip_special_tokens=*/true),
        stops(req->options.stop),
        history(req->prompt) {}

  std::shared_ptr<Request> req;
  LayerCaches caches;
  Sampler sampler;
  StreamDecoder decoder;
  StopStringMatcher stops;
  std::vector<int32_t> history;         // prompt + generated tokens
  int64_t prefilled = 0;                // prompt tokens in the caches
  int64_t reused = 0;                   // ... of which came from the session or the prefix cache
  std::optional<std::string> settings;  // prefix cache key of the KV settings (none: bypass)
  int64_t sampled = 0;                  // sampled tokens, a stopping EOS included
  int64_t generated = 0;                // sampled tokens, a stopping EOS excluded
  std::vector<float> logits;            // [vocab] of the last token fed
  float logprob = 0;                    // of the last sampled token (options.logprobs)
  std::vector<TokenLogprob> top_logprobs;
  bool started = false, done = false;
  Clock::time_point t_start, t_first_token, t_last_token;
};

namespace {

// The most that the pool's promises may total.
size_t promisable(const KVPoolUse& u) {
  return u.promisable_bytes > 0 ? u.promisable_bytes : u.capacity_bytes;
}

std::vector<int32_t> undecodable_ids(const Tokenizer& tokenizer, int vocab_size) {
  std::vector<int32_t> ids;
  const int known = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < known; ++id) {
    try {
      tokenizer.id_to_token(id);
    } catch (const Error&) {
      ids.push_back(id);
    }
  }
  for (int32_t id = std::max(known, 0); id < vocab_size; ++id) ids.push_back(id);
  return ids;
}

class Stream : public GenerationStream {
 public:
  explicit Stream(std::shared_ptr<Scheduler::Request> req) : req_(std::move(req)) {}
  ~Stream() override {
    if (!finished_) cancel();
  }

  bool next(GenerationChunk* chunk) override;
  StreamWait next_for(GenerationChunk* chunk, std::chrono::milliseconds timeout) override;
  void cancel() override;

 private:
  std::shared_ptr<Scheduler::Request> req_;
  bool finished_ = false;
};

}  // namespace

// Stream's members need Request's definition, which is local to this file.
bool Stream::next(GenerationChunk* chunk) {
  StreamWait r;
  do {
    r = next_for(chunk, std::chrono::hours(24));
  } while (r == StreamWait::kTimeout);
  return r == StreamWait::kChunk;
}

StreamWait Stream::next_for(GenerationChunk* chunk, std::chrono::milliseconds timeout) {
  if (finished_) return StreamWait::kDone;
  std::unique_lock<std::mutex> lock(req_->mu);
  if (!req_->cv.wait_for(lock, timeout, [&] { return !req_->chunks.empty() || req_->error; })) {
    return StreamWait::kTimeout;
  }
  if (req_->chunks.empty()) {
    finished_ = true;
    std::rethrow_exception(req_->error);
  }
  *chunk = std::move(req_->chunks.front());
  req_->chunks.pop_front();
  if (chunk->done) finished_ = true;
  return StreamWait::kChunk;
}

void Stream::cancel() {
  req_->cancelled = true;
}

Scheduler::Scheduler(const Model& model, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids,
                     const EngineOptions& options, CacheFactory make_caches,
                     KVAdmission admission)
    : model_(model),
      tokenizer_(tokenizer),
      eos_ids_(std::move(eos_ids)),
      options_(options),
      make_caches_(std::move(make_caches)),
      admission_(std::move(admission)),
      default_kv_(resolve_kv_options(options.kv)),
      layer_specs_(model.layer_specs()),
      context_length_(model.info().max_position_embeddings),
      vocab_size_(model.info().vocab_size),
      masked_ids_(undecodable_ids(tokenizer, vocab_size_)) {
  if (options.max_sequences < 1) {
    throw InvalidArgument(str_cat("max_sequences=", options.max_sequences, " must be >= 1"));
  }
  if (options.max_waiting < 0) {
    throw InvalidArgument(str_cat("max_waiting=", options.max_waiting, " must be >= 0"));
  }
  if (options.prefill_chunk < 1) {
    throw InvalidArgument(str_cat("prefill_chunk=", options.prefill_chunk, " must be >= 1"));
  }
  if (options.max_batch_tokens <= options.max_sequences) {
    throw InvalidArgument(str_cat("max_batch_tokens=", options.max_batch_tokens,
                                  " must exceed max_sequences=", options.max_sequences,
                                  " so prefill can progress while every sequence decodes"));
  }
  if (context_length_ <= 0) context_length_ = INT64_MAX;
  chunk_ = std::min(options.prefill_chunk, options.max_batch_tokens - options.max_sequences + 1);
  if (options.prefix_cache_bytes < -1) {
    throw InvalidArgument(str_cat("prefix_cache_bytes=", options.prefix_cache_bytes,
                                  " must be >= 0, or -1 for the default"));
  }
  const int prefix_block = options.prefix_cache_block == 0 ? 64 : options.prefix_cache_block;
  if (prefix_block < 16 || prefix_block > 4096) {
    throw InvalidArgument(str_cat("prefix_cache_block=", options.prefix_cache_block,
                                  " is not in 16..4096 tokens (0: the device's choice)"));
  }
  size_t budget = static_cast<size_t>(options.prefix_cache_bytes);
  if (options.prefix_cache_bytes < 0) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    const size_t physical = pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
    budget = std::min(physical / 10, size_t(8) << 30);
  }
  const bool sliding = std::any_of(layer_specs_.begin(), layer_specs_.end(),
                                   [](const LayerSpec& l) { return l.sliding_window > 0; });
  if (budget > 0 && !sliding) {
    prefix_ =
        std::make_unique<PrefixCache>(budget, prefix_block, chunk_, layer_specs_);
    // Stored blocks live in the device pool too: they hold promises like running requests.
    if (admission_) prefix_->set_pool(admission_.reserve, admission_.release);
  }
  if (static_cast<int64_t>(masked_ids_.size()) >= vocab_size_) {
    throw InvalidArgument(
        str_cat("the tokenizer decodes none of the model's ", vocab_size_, " token ids"));
  }
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& seq : active_) finish(*seq, FinishReason::kCancelled, "", -1);
  for (auto& req : waiting_) {
    if (req->session) req->session->release_untaken();
    GenerationChunk chunk;
    chunk.done = true;
    chunk.finish_reason = FinishReason::kCancelled;
    req->post(std::move(chunk));
  }
}

std::shared_ptr<SessionImpl> Scheduler::new_session(const ResolvedKV& kv) const {
  return std::make_shared<SessionImpl>(this, kv, layer_specs_);
}

void Scheduler::start() {
  thread_ = std::thread([this] { run(); });
}

std::unique_ptr<GenerationStream> Scheduler::submit(std::vector<int32_t> prompt,
                                                    const GenerateOptions& options) {
  if (prompt.empty()) throw InvalidArgument("the prompt is empty: it needs at least one token");
  if (static_cast<int64_t>(prompt.size()) > context_length_) {
    throw InvalidArgument(str_cat("the prompt has ", prompt.size(),
                                  " tokens, more than the model's context of ", context_length_,
                                  " tokens"));
  }
  check_token_ids(prompt, "prompt");
  check_token_ids(options.forced_tokens, "forced_tokens");
  for (const auto& [id, bias] : options.sampling.logit_bias) {
    if (id < 0 || id >= vocab_size_) {
      throw InvalidArgument(
          str_cat("logit_bias: token id ", id, " is outside the vocabulary [0, ", vocab_size_, ")"),
          "logit_bias");
    }
  }
  if (options.top_logprobs < 0 || options.top_logprobs > 20) {
    throw InvalidArgument(str_cat("top_logprobs=", options.top_logprobs, " must be in [0, 20]"),
                          "top_logprobs");
  }
  if (options.max_tokens < 1) {
    throw InvalidArgument(str_cat("max_tokens=", options.max_tokens, " must be >= 1"),
                          "max_tokens");
  }
  validate_sampling(options.sampling);

  auto req = std::make_shared<Request>();
  req->kv = options.kv ? resolve_kv_options(*options.kv) : default_kv_;
  if (options.session) {
    auto session = std::dynamic_pointer_cast<SessionImpl>(options.session);
    if (!session || session->owner() != this) {
      throw InvalidArgument("the session belongs to another engine");
    }
    if (options.kv && req->kv != session->kv()) {
      throw InvalidArgument(str_cat("the session's KV settings are '", describe_kv(session->kv()),
                                    "'; the request asks for '", describe_kv(req->kv), "'"));
    }
    req->kv = session->kv();
    session->acquire();
    req->session = std::move(session);
  }
  req->prompt = std::move(prompt);
  req->options = options;
  req->options.session.reset();  // the request holds it as req->session
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int64_t>(waiting_.size()) >= options_.max_waiting) {
      if (req->session) req->session->release_untaken();
      throw Overloaded(str_cat("the request queue is full (", options_.max_waiting,
                               " waiting requests); retry later"));
    }
    req->id = next_id_++;
    waiting_.push_back(req);
    ++metrics_.requests_total;
    metrics_.prompt_tokens_total += static_cast<int64_t>(req->prompt.size());
    metrics_.waiting_requests = static_cast<int64_t>(waiting_.size());
  }
  cv_.notify_one();
  return std::make_unique<Stream>(req);
}

void Scheduler::check_token_ids(std::span<const int32_t> ids, const char* what) const {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) {
      throw InvalidArgument(
          str_cat(what, ": token id ", id, " is outside the vocabulary [0, ", vocab_size_, ")"));
    }
  }
}

EngineMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return metrics_;
}

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty() || !active_.empty(); });
      if (stop_) return;
    }
    try {
      step();
    } catch (...) {
      // A failure outside one sequence's work (step() isolates those): the batch's requests fail,
      // the engine thread keeps serving.
      const auto error = std::current_exception();
      for (auto& seq : active_) {
        if (!seq->done) fail(*seq, error);
      }
      std::erase_if(active_, [](const auto& s) { return s->done; });
      publish_metrics(/*forward_pass=*/false);
    }
  }
}

void Scheduler::release_kv(Request& req) {
  if (req.kv_promised > 0 && admission_) admission_.release(req.kv_promised);
  req.kv_promised = 0;
}

void Scheduler::fail(Sequence& seq, std::exception_ptr error) {
  seq.done = true;
  release_kv(*seq.req);
  if (seq.req->session) seq.req->session->release(LayerCaches{}, {}, /*keep=*/false);
  seq.req->fail(std::move(error));
  std::lock_guard<std::mutex> lock(mu_);
  ++metrics_.requests_failed;
}

void Scheduler::admit_waiting() {
  std::vector<std::shared_ptr<Request>> admitted;
  auto refuse = [&](const std::shared_ptr<Request>& req, std::exception_ptr error) {
    if (req->session) req->session->release(LayerCaches{}, {}, /*keep=*/false);
    req->fail(std::move(error));
    std::lock_guard<std::mutex> lock(mu_);
    ++metrics_.requests_failed;
  };
  for (;;) {
    std::shared_ptr<Request> front;  // only this thread pops, so it stays the front
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (waiting_.empty() ||
          static_cast<int>(active_.size() + admitted.size()) >= options_.max_sequences) {
        break;
      }
      front = waiting_.front();
    }
    if (admission_) {
      // The pool promises the bytes of prompt + max_tokens tokens, or the request waits.
      try {
        const int64_t tokens =
            std::min<int64_t>(int64_t(front->prompt.size()) + front->options.max_tokens,
                              context_length_);
        const size_t need = admission_.bytes_for(front->kv, tokens);
        bool promised = admission_.reserve(need);
        // Blocks the prefix cache holds give way to a request, oldest first, when the promises
        // of running requests leave room for it.
        if (!promised && prefix_ && prefix_->pooled_bytes() > 0 && admission_.use) {
          const KVPoolUse before = admission_.use();
          if (before.reserved_bytes - prefix_->pooled_bytes() + need <= promisable(before)) {
            while (!promised && prefix_->evict_oldest()) promised = admission_.reserve(need);
          }
        }
        const KVPoolUse use = admission_.use ? admission_.use() : KVPoolUse{};
        if (!promised) {
          const size_t stored = prefix_ ? std::min(prefix_->pooled_bytes(), use.reserved_bytes) : 0;
          if (use.reserved_bytes == stored) {  // no running request holds a promise: never fits
            const size_t can = promisable(use);
            throw InvalidArgument(
                str_cat("the request's KV cache (", tokens, " tokens, ",
                        (need + (1 << 20) - 1) >> 20, " MiB) does not fit the KV pool of ",
                        use.capacity_bytes >> 20, " MiB",
                        can < use.capacity_bytes
                            ? str_cat(", of which ", can >> 20,
                                      " MiB can be promised to requests (the rest is kept for "
                                      "blocks of other sizes)")
                            : std::string(),
                        "; ask for fewer tokens, a smaller kv_bits or a larger KV pool"),
                "max_tokens");
          }
          if (!front->kv_waited) {
            front->kv_waited = true;
            std::lock_guard<std::mutex> lock(mu_);
            ++metrics_.kv_pool_waits;
          }
          break;  // queued until a running request gives its promise back
        }
        front->kv_promised = need;
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          waiting_.pop_front();
        }
        refuse(front, std::current_exception());
        continue;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    waiting_.pop_front();
    admitted.push_back(std::move(front));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.waiting_requests = static_cast<int64_t>(waiting_.size());
  }
  for (auto& req : admitted) {
    try {
      active_.push_back(start_sequence(req));
    } catch (...) {
      release_kv(*req);
      refuse(req, std::current_exception());
    }
  }
}

const std::optional<std::string>& Scheduler::settings_for(const ResolvedKV& kv) {
  for (const auto& [known, settings] : settings_) {
    if (known == kv) return settings;
  }
  if (settings_.size() >= 64) settings_.clear();  // requests may ask for any number of settings
  settings_.emplace_back(kv, PrefixCache::settings_of(make_caches_(kv)));
  return settings_.back().second;
}

std::unique_ptr<Scheduler::Sequence> Scheduler::start_sequence(std::shared_ptr<Request> req) {
  const auto start = Clock::now();
  const std::vector<int32_t>& prompt = req->prompt;
  // At least the last prompt token is fed: its logits give the first sampled token.
  const int64_t reusable = static_cast<int64_t>(prompt.size()) - 1;
  LayerCaches caches;
  int64_t reused = 0;
  bool from_session = false;
  if (req->session) {
    std::vector<int32_t> tokens;
    req->session->take(&caches, &tokens);
    if (!caches.empty()) {
      const int64_t held = std::min<int64_t>(caches.front()->size(), int64_t(tokens.size()));
      int64_t common = 0;
      while (common < std::min(held, reusable) &&
             tokens[size_t(common)] == prompt[size_t(common)]) {
        ++common;
      }
      int64_t calibration = 0;
      for (const auto& c : caches) calibration = std::max(calibration, c->calibration_tokens());
      // A prefix shorter than what fixed the caches' state would keep a state estimated from
      // tokens this prompt does not have: start afresh instead.
      if (common > 0 && common >= calibration) {
        try {
          for (auto& c : caches) c->trim(c->size() - common);
          reused = common;
          from_session = true;
        } catch (const Unsupported&) {  // a sliding window evicted what the trim needs
        }
      }
      if (!from_session) caches.clear();
    }
  }
  if (caches.empty()) caches = make_caches_(req->kv);
  auto seq = std::make_unique<Sequence>(req, std::move(caches), tokenizer_, masked_ids_);
  if (prefix_) seq->settings = settings_for(req->kv);
  if (!from_session && prefix_ && seq->settings) {
    try {
      reused = prefix_->restore(*seq->settings, prompt, reusable, seq->caches);
    } catch (const std::exception&) {  // the rows do not fit these caches: prefill instead
      seq->caches = make_caches_(req->kv);
      reused = 0;
    }
  }
  publish_prefix_stats();
  seq->prefilled = seq->reused = reused;
  if (reused > 0) {
    seq->started = true;
    seq->t_start = start;
    std::lock_guard<std::mutex> lock(mu_);
    if (from_session) metrics_.session_reused_tokens += reused;
  }
  return seq;
}

void Scheduler::cache_prefix(const Sequence& seq) {
  if (!prefix_ || !seq.settings || seq.caches.empty()) return;
  const int64_t held = seq.caches.front()->size();
  if (held < prefix_->block_tokens()) return;
  prefix_->insert(*seq.settings, std::span<const int32_t>(seq.history.data(), size_t(held)),
                  seq.caches);
  publish_prefix_stats();
}

GenerationStats Scheduler::stats_of(const Sequence& seq) const {
  GenerationStats s;
  s.prompt_tokens = static_cast<int64_t>(seq.req->prompt.size());
  s.generated_tokens = seq.generated;
  s.kv = seq.req->kv;
  if (seq.sampled > 0) {
    s.prompt_seconds = std::chrono::duration<double>(seq.t_first_token - seq.t_start).count();
    s.generation_seconds =
        std::chrono::duration<double>(seq.t_last_token - seq.t_first_token).count();
    if (s.prompt_seconds > 0) s.prompt_tps = s.prompt_tokens / s.prompt_seconds;
    // Decode steps: every sampled token after the first came from one forward pass.
    if (s.generation_seconds > 0) s.generation_tps = (seq.sampled - 1) / s.generation_seconds;
  }
  if (!seq.caches.empty()) {
    s.cached_tokens = seq.caches.front()->size();
    for (const auto& c : seq.caches) {
      s.kv_bytes += c->nbytes();
      s.state_bytes += c->state_bytes();
    }
  }
  s.kv_bytes_dense = dense_kv_bytes(layer_specs_, s.cached_tokens);
  s.prompt_cached_tokens = seq.reused;
  return s;
}

void Scheduler::finish(Sequence& seq, FinishReason reason, std::string text, int32_t token) {
  if (reason != FinishReason::kCancelled) {
    bool stopped = false;
    text += seq.stops.push(seq.decoder.flush(), &stopped);
    if (!stopped) text += seq.stops.flush();
  }
  GenerationChunk chunk;
  chunk.text = std::move(text);
  chunk.token = token;
  if (token >= 0) {
    chunk.logprob = seq.logprob;
    chunk.top_logprobs = std::move(seq.top_logprobs);
  }
  chunk.prompt_processed = seq.prefilled;
  chunk.done = true;
  chunk.finish_reason = reason;
  chunk.stats = stats_of(seq);
  seq.done = true;
  release_kv(*seq.req);
  try {
    cache_prefix(seq);
  } catch (const std::exception&) {  // a copy that failed: these blocks stay uncached
  }
  // Before the done chunk: the client may use the session again as soon as it sees it.
  if (seq.req->session) {
    seq.req->session->release(std::move(seq.caches), seq.history, /*keep=*/true);
  }
  seq.req->post(std::move(chunk));
}

void Scheduler::on_token(Sequence& seq, int32_t token) {
  const auto now = Clock::now();
  if (seq.sampled++ == 0) seq.t_first_token = now;
  seq.t_last_token = now;
  const auto& opt = seq.req->options;
  const bool is_stop_token =
      !opt.ignore_eos && (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end() ||
                          std::find(opt.stop_token_ids.begin(), opt.stop_token_ids.end(), token) !=
                              opt.stop_token_ids.end());
  if (is_stop_token) {
    finish(seq, FinishReason::kStop, "", -1);
    return;
  }
  const auto& forced = opt.forced_tokens;
  const bool force = seq.generated < static_cast<int64_t>(forced.size());
  seq.history.push_back(force ? forced[seq.generated] : token);
  ++seq.generated;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++metrics_.generated_tokens_total;
  }
  bool stopped = false;
  std::string text = seq.stops.push(seq.decoder.push(token), &stopped);
  if (stopped) {
    finish(seq, FinishReason::kStop, std::move(text), token);
  } else if (seq.generated >= opt.max_tokens || seq.caches.front()->size() >= context_length_) {
    finish(seq, FinishReason::kLength, std::move(text), token);
  } else {
    GenerationChunk chunk;
    chunk.text = std::move(text);
    chunk.token = token;
    chunk.logprob = seq.logprob;
    chunk.top_logprobs = std::move(seq.top_logprobs);
    chunk.prompt_processed = seq.prefilled;
    chunk.stats = stats_of(seq);
    seq.req->post(std::move(chunk));
  }
}

void Scheduler::step() {
  admit_waiting();
  for (auto& seq : active_) {
    if (seq->req->cancelled) finish(*seq, FinishReason::kCancelled, "", -1);
  }
  std::erase_if(active_, [](const auto& s) { return s->done; });
  if (active_.empty()) {
    publish_metrics(/*forward_pass=*/false);  // the last sequences may just have been cancelled
    return;
  }

  // Decode tokens first (one per sequence), then prompt chunks within the token budget.
  std::vector<Model::Chunk> chunks;
  std::vector<Sequence*> batch;
  int budget = options_.max_batch_tokens;
  for (auto& seq : active_) {
    if (seq->prefilled < static_cast<int64_t>(seq->req->prompt.size())) continue;
    Model::Chunk c;
    c.tokens = &seq->history.back();
    c.n_tokens = 1;
    chunks.push_back(c);
    batch.push_back(seq.get());
    --budget;
  }
  for (auto& seq : active_) {
    const int64_t remaining = static_cast<int64_t>(seq->req->prompt.size()) - seq->prefilled;
    // Up to the next multiple of the chunk size; never cut by the budget (it waits instead).
    const int64_t aligned = chunk_ - seq->prefilled % chunk_;
    Model::Chunk c;
    c.tokens = seq->req->prompt.data() + seq->prefilled;
    c.n_tokens = static_cast<int>(std::min(remaining, aligned));
    if (remaining == 0 || c.n_tokens > budget) continue;
    chunks.push_back(c);
    batch.push_back(seq.get());
    budget -= c.n_tokens;
    if (!seq->started) {
      seq->started = true;
      seq->t_start = Clock::now();
    }
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    batch[i]->logits.resize(vocab_size_);
    chunks[i].caches = &batch[i]->caches;
    chunks[i].logits = batch[i]->logits.data();
  }

  try {
    model_.forward(chunks);
  } catch (...) {
    // The batch's caches may be half-written: those sequences fail, the others never ran.
    const auto error = std::current_exception();
    for (Sequence* seq : batch) fail(*seq, error);
    std::erase_if(active_, [](const auto& s) { return s->done; });
    publish_metrics(/*forward_pass=*/false);
    return;
  }

  for (size_t i = 0; i < chunks.size(); ++i) {
    Sequence& seq = *batch[i];
    const int64_t prompt_size = static_cast<int64_t>(seq.req->prompt.size());
    if (seq.prefilled < prompt_size) {
      seq.prefilled += chunks[i].n_tokens;
      if (seq.prefilled < prompt_size) {
        GenerationChunk progress;
        progress.prompt_processed = seq.prefilled;
        progress.stats = stats_of(seq);
        seq.req->post(std::move(progress));
        continue;
      }
      try {
        cache_prefix(seq);  // later requests with this prompt need not wait for the end
      } catch (const std::exception&) {
      }
    }
    try {
      // Sampling, detokenizing and stop matching are this sequence's alone: a failure there
      // (a tokenizer that cannot decode an id, ...) ends only this request.
      const GenerateOptions& opt = seq.req->options;
      const size_t n_generated = seq.history.size() - seq.req->prompt.size();
      const int32_t token = opt.logprobs ? seq.sampler.sample_with_logprobs(
                                               seq.logits, seq.history, n_generated,
                                               opt.top_logprobs, &seq.logprob, &seq.top_logprobs)
                                         : seq.sampler.sample(seq.logits, seq.history, n_generated);
      on_token(seq, token);
    } catch (...) {
      fail(seq, std::current_exception());
    }
  }
  std::erase_if(active_, [](const auto& s) { return s->done; });
  publish_metrics(/*forward_pass=*/true);
}

void Scheduler::publish_metrics(bool forward_pass) {
  size_t kv_bytes = 0, kv_dense = 0, state_bytes = 0;
  for (const auto& seq : active_) {
    const auto s = stats_of(*seq);
    kv_bytes += s.kv_bytes;
    kv_dense += s.kv_bytes_dense;
    state_bytes += s.state_bytes;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (forward_pass) ++metrics_.forward_passes;
  metrics_.active_sequences = static_cast<int64_t>(active_.size());
  metrics_.kv_bytes = kv_bytes;
  metrics_.kv_bytes_dense = kv_dense;
  metrics_.state_bytes = state_bytes;
  if (admission_.use) metrics_.kv_pool = admission_.use();
}

void Scheduler::publish_prefix_stats() {
  if (!prefix_) return;
  const PrefixCacheStats& p = prefix_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.prefix_cache_lookups = p.lookups;
  metrics_.prefix_cache_hits = p.hits;
  metrics_.prefix_cache_hit_tokens = p.hit_tokens;
  metrics_.prefix_cache_evictions = p.evictions;
  metrics_.prefix_cache_blocks = p.blocks;
  metrics_.prefix_cache_tokens = p.tokens;
  metrics_.prefix_cache_bytes = p.bytes;
  metrics_.prefix_cache_bytes_dense = p.bytes_dense;
  metrics_.prefix_cache_capacity_bytes = p.capacity_bytes;
}

}  // namespace turbokv
