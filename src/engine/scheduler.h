// Continuous batching: one engine thread owns every active sequence. Each step runs ONE batched
// Model::forward with a Chunk per sequence: one token for each decoding sequence, then prompt
// chunks of new sequences (chunked prefill) up to the step's token budget. Requests join and
// leave between steps. Every sequence has its own KV caches, built from its own resolved KV
// options, so no request can see or disturb another's state.
//
// Prompt chunks are aligned: a prompt is fed in pieces that end at multiples of the prefill
// chunk (or at its end), and a piece that does not fit the step's budget waits for the next
// step instead of being cut. So what a cache estimates from its first chunk, and hence the
// output, does not depend on the other requests in the batch, and the prefix cache can tell
// when two sequences coded the same prefix identically.
//
// Admission: a request on a session takes the session's caches and keeps their common prefix
// with its prompt; otherwise its fresh caches get the longest prefix the prefix cache has for
// its prompt and KV settings (engine/prefix_cache.h). Either way those tokens are not
// prefilled. A finished prompt's full blocks, and a finished request's, go into the prefix
// cache; a session gets its request's caches and tokens back when the request ends.
//
// With a KV pool (KVAdmission, the GPU): a request is admitted, in arrival order, only once the
// pool promises the bytes its caches take at prompt + max_tokens tokens (capped at the context
// length); until then it stays queued (and a full queue is Overloaded, HTTP 429). A request
// whose bytes exceed what the pool can ever promise fails with InvalidArgument. The promise is
// released when the request ends (blocks a session or the prefix cache then keeps are used,
// not promised).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "engine/prefix_cache.h"
#include "engine/session.h"
#include "kv/cache_policy.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "turbokv/engine.h"

namespace turbokv {


// fp16 bytes of K and V for `tokens` tokens in every layer that stores K/V (KV-shared layers
// and recurrent states count nothing).
size_t dense_kv_bytes(const std::vector<LayerSpec>& layers, int64_t tokens);

class Scheduler {
 public:
  struct Request;  // shared by the engine thread and the request's GenerationStream
  struct Sequence;

  // eos_ids end every request unless GenerateOptions::ignore_eos. Throws InvalidArgument for bad
  // limits or default KV options.
  Scheduler(const Model& model, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids,
            const EngineOptions& options, CacheFactory make_caches,
            KVAdmission admission = {});
  ~Scheduler();  // stops the engine thread; running requests end as cancelled

  // Starts the engine thread (separate from construction so tests can queue requests first).
  void start();

  // Validates and queues a request. Throws InvalidArgument (bad options or prompt) or
  // Overloaded (queue full).
  std::unique_ptr<GenerationStream> submit(std::vector<int32_t> prompt,
                                           const GenerateOptions& options);

  EngineMetrics metrics() const;
  const ResolvedKV& default_kv() const { return default_kv_; }
  // The prompt chunk actually used: EngineOptions::prefill_chunk capped so that a chunk always
  // fits beside every other sequence's decode token.
  int prefill_chunk() const { return chunk_; }

  // A new empty session for requests of this scheduler (kv: resolved KV options).
  std::shared_ptr<SessionImpl> new_session(const ResolvedKV& kv) const;
  // Caches for kv, as every sequence gets them.
  LayerCaches make_caches(const ResolvedKV& kv) const { return make_caches_(kv); }

 private:
  void run();
  void step();
  void admit_waiting();
  // Builds the sequence of an admitted request: its caches with what a session or the prefix
  // cache already holds of its prompt.
  std::unique_ptr<Sequence> start_sequence(std::shared_ptr<Request> req);
  // The prefix cache's settings key for kv (nullopt: its caches cannot be copied).
  const std::optional<std::string>& settings_for(const ResolvedKV& kv);
  // Offers the sequence's full blocks to the prefix cache.
  void cache_prefix(const Sequence& seq);
  // Copies the prefix cache's counters into the metrics (before a client can see the effect).
  void publish_prefix_stats();
  void finish(Sequence& seq, FinishReason reason, std::string text, int32_t token);
  void on_token(Sequence& seq, int32_t token);
  GenerationStats stats_of(const Sequence& seq) const;
  void check_token_ids(std::span<const int32_t> ids, const char* what) const;
  // Ends seq with error, as a failed request (the others keep running).
  void fail(Sequence& seq, std::exception_ptr error);
  // Gives back what the pool promised the request (once).
  void release_kv(Request& req);
  // Copies the active sequences' count and KV bytes into the metrics (after every step, so
  // they fall back to 0 as soon as the last sequence ends).
  void publish_metrics(bool forward_pass);

  const Model& model_;
  const Tokenizer& tokenizer_;
  std::vector<int32_t> eos_ids_;
  EngineOptions options_;
  CacheFactory make_caches_;
  KVAdmission admission_;  // engine thread only; empty: no pool
  ResolvedKV default_kv_;  // options_.kv, resolved once
  std::vector<LayerSpec> layer_specs_;
  int64_t context_length_;
  int vocab_size_;
  int chunk_;
  std::unique_ptr<PrefixCache> prefix_;  // engine thread only; null when off
  std::vector<std::pair<ResolvedKV, std::optional<std::string>>> settings_;  // engine thread
  // Ids the model scores but the tokenizer cannot decode (vocab_size padded past the tokenizer,
  // or holes in its ids), sorted: the sampler never picks them.
  std::vector<int32_t> masked_ids_;

  mutable std::mutex mu_;  // guards waiting_, stop_, metrics_ counters below
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> waiting_;
  bool stop_ = false;
  uint64_t next_id_ = 1;
  EngineMetrics metrics_;

  std::vector<std::unique_ptr<Sequence>> active_;  // engine thread only
  std::thread thread_;
};

}  // namespace turbokv
