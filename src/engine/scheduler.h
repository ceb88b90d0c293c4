// Continuous batching: one engine thread owns every active sequence. Each step runs ONE batched
// Model::forward with a Chunk per sequence: one token for each decoding sequence, then prompt
// chunks of new sequences (chunked prefill) up to the step's token budget. Requests join and
// leave between steps. Every sequence has its own KV caches, built from its own resolved KV
// options, so no request can see or disturb another's state.
//
// Prompt chunks are aligned: a prompt is fed in pieces that end at multiples of the prefill
// chunk (or at its end), and a piece that does not fit the step's budget waits for the next
// step instead of being cut. So what a cache estimates from its first chunk, and hence the
// output, does not depend on the other requests in the batch.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "turbokv/engine.h"

namespace turbokv {

// Builds one sequence's caches (tests inject fakes; the engine uses make_layer_caches).
using CacheFactory = std::function<LayerCaches(const ResolvedKV&)>;

// fp16 bytes of K and V for `tokens` tokens in every layer.
size_t dense_kv_bytes(const std::vector<LayerSpec>& layers, int64_t tokens);

class Scheduler {
 public:
  struct Request;  // shared by the engine thread and the request's GenerationStream
  struct Sequence;

  // eos_ids end every request unless GenerateOptions::ignore_eos. Throws InvalidArgument for bad
  // limits or default KV options.
  Scheduler(const Model& model, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids,
            const EngineOptions& options, CacheFactory make_caches);
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

 private:
  void run();
  void step();
  void admit_waiting();
  void finish(Sequence& seq, FinishReason reason, std::string text, int32_t token);
  void on_token(Sequence& seq, int32_t token);
  GenerationStats stats_of(const Sequence& seq) const;
  void check_token_ids(std::span<const int32_t> ids, const char* what) const;

  const Model& model_;
  const Tokenizer& tokenizer_;
  std::vector<int32_t> eos_ids_;
  EngineOptions options_;
  CacheFactory make_caches_;
  ResolvedKV default_kv_;  // options_.kv, resolved once
  std::vector<LayerSpec> layer_specs_;
  int64_t context_length_;
  int vocab_size_;
  int chunk_;

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
