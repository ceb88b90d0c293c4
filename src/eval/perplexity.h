// Perplexity with the contract of docs/design.md, "Contracts": chunk i is tokens [i·C, (i+1)·C +
// 1), each chunk a fresh sequence (fresh caches), all C next-token predictions scored. With a KV
// scheme the dense cache runs on the same tokens in the same forward passes, and the quantized run
// is compared to it: KL(dense || quantized) of the next-token distributions and top-1 agreement.
// Every token attends to its own K/V as stored by its cache (quantized caches code the fresh
// tokens too), which is what decoding sees.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/cache_policy.h"
#include "model/model.h"
#include "turbokv/kv_options.h"

namespace turbokv {

// Running sums over scored tokens.
struct PerplexityStats {
  int64_t tokens = 0;
  double nll_sum = 0;        // -log p(target) under the scored logits
  double dense_nll_sum = 0;  // the same under the dense logits (when given)
  double kld_sum = 0;        // Σ KL(dense || scored)
  int64_t top1_agree = 0;    // argmax(scored) == argmax(dense)

  double ppl() const;
  double dense_ppl() const;
  double kld_mean() const;
  double top1_agreement() const;
};

// Scores n rows: logits [n, vocab], targets [n]; dense_logits [n, vocab] or null.
void score_logits(const float* logits, const float* dense_logits, const int32_t* targets, int64_t n,
                  int vocab, PerplexityStats& stats);

struct PerplexityOptions {
  int context = 1024;            // C
  int64_t max_chunks = 0;        // 0: all chunks the tokens allow
  ResolvedKV kv;                 // scheme kDense: the dense pass only
  int tokens_per_forward = 256;  // a chunk is fed in pieces this long (bounds logits memory)
  CacheFactory make_caches;      // the model's caches (empty: the CPU's make_layer_caches)
};

struct PerplexityResult {
  int64_t chunks = 0;
  PerplexityStats stats;  // with a KV scheme: scored = quantized, dense = baseline
  bool quantized = false;
  std::string kv_scheme = "dense";
  // Bits per K/V element, 8·bytes / (tokens·kv_heads·d·2) summed over the chunks' caches:
  // everything stored for the whole model (codes, norms, means, split orders, fp16 sink tokens
  // and the dense layers at fp16) ...
  double kv_bits_effective = 0;
  // ... and over the quantized layers alone.
  double kv_bits_quantized_layers = 0;
  // With kv allocation on: the first chunk's per-layer bits (each chunk, a fresh sequence,
  // measures and allocates its own), e.g. "0:3/5,1:4/3".
  std::string kv_layer_bits;
};

// Throws InvalidArgument when the tokens do not fill one chunk (fewer than C + 1) or the
// options are out of range. progress(chunk_done, chunks_total, stats) after every chunk.
PerplexityResult run_perplexity(
    const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& options,
    const std::function<void(int64_t, int64_t, const PerplexityStats&)>& progress = {});

// Several KV settings against one dense pass: every chunk's dense logits are computed once and
// each setting in kvs (none dense) is scored against them, exactly as run_perplexity scores one
// (options.kv is ignored). Returns one result per setting, in order. progress(chunk_done,
// chunks_total, results so far) after every chunk. Throws InvalidArgument for no settings or a
// dense one.
std::vector<PerplexityResult> run_perplexity_sweep(
    const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& options,
    const std::vector<ResolvedKV>& kvs,
    const std::function<void(int64_t, int64_t, const std::vector<PerplexityResult>&)>& progress =
        {});

}  // namespace turbokv
