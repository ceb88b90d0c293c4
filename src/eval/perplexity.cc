// Perplexity and KV-cache quality against the dense cache (perplexity.h).
#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/log_softmax.h"
#include "kv/cache_policy.h"
#include "kv/kv_allocation.h"
#include "kv/kv_resolve.h"

namespace turbokv {
namespace {

bool is_quantized(const KVCache& cache) {
  return cache.type_name().rfind("dense", 0) != 0 && cache.type_name() != "rotating";
}

}  // namespace

double PerplexityStats::ppl() const {
  return std::exp(nll_sum / double(std::max<int64_t>(tokens, 1)));
}
double PerplexityStats::dense_ppl() const {
  return std::exp(dense_nll_sum / double(std::max<int64_t>(tokens, 1)));
}
double PerplexityStats::kld_mean() const {
  return kld_sum / double(std::max<int64_t>(tokens, 1));
}
double PerplexityStats::top1_agreement() const {
  return double(top1_agree) / double(std::max<int64_t>(tokens, 1));
}

void score_logits(const float* logits, const float* dense_logits, const int32_t* targets, int64_t n,
                  int vocab, PerplexityStats& stats) {
  std::vector<double> logp, dense_logp;  // [vocab]
  for (int64_t r = 0; r < n; ++r) {
    const float* row = logits + r * vocab;
    log_softmax(row, vocab, logp);
    stats.nll_sum -= logp[size_t(targets[r])];
    if (dense_logits != nullptr) {
      const float* dense_row = dense_logits + r * vocab;
      log_softmax(dense_row, vocab, dense_logp);
      stats.dense_nll_sum -= dense_logp[size_t(targets[r])];
      stats.kld_sum += kl_divergence(dense_logp, logp);
      stats.top1_agree += std::max_element(row, row + vocab) - row ==
                          std::max_element(dense_row, dense_row + vocab) - dense_row;
    }
    ++stats.tokens;
  }
}

namespace {

// Chunk count for these tokens and options; throws InvalidArgument for bad options.
int64_t check_and_count_chunks(std::span<const int32_t> tokens, const PerplexityOptions& options) {
  const int64_t C = options.context;
  if (C < 1 || C > (1 << 20)) {
    throw InvalidArgument(str_cat("context ", C, " is out of range (1..1048576)"));
  }
  if (options.max_chunks < 0) {
    throw InvalidArgument(str_cat("max_chunks ", options.max_chunks, " must be >= 0"));
  }
  if (options.tokens_per_forward < 1) {
    throw InvalidArgument(
        str_cat("tokens_per_forward ", options.tokens_per_forward, " must be >= 1"));
  }
  int64_t chunks = (int64_t(tokens.size()) - 1) / C;
  if (chunks < 1) {
    throw InvalidArgument(str_cat("the text has ", tokens.size(), " tokens; one chunk of context ",
                                  C, " needs ", C + 1));
  }
  if (options.max_chunks > 0) chunks = std::min(chunks, options.max_chunks);
  return chunks;
}

// Stored bytes and K/V elements of one sequence's caches, all layers and quantized layers.
struct KVSize {
  size_t bytes = 0, quant_bytes = 0;
  int64_t elements = 0, quant_elements = 0;  // tokens · kv_heads · d · 2

  void add(const LayerCaches& caches) {
    for (const auto& c : caches) {
      const int64_t elements_here = c->size() * c->kv_heads() * c->head_dim() * 2;
      bytes += c->nbytes();
      elements += elements_here;
      if (!is_quantized(*c)) continue;
      quant_bytes += c->nbytes();
      quant_elements += elements_here;
    }
  }
  void report(PerplexityResult& r) const {
    if (elements > 0) r.kv_bits_effective = 8.0 * double(bytes) / double(elements);
    if (quant_elements > 0) {
      r.kv_bits_quantized_layers = 8.0 * double(quant_bytes) / double(quant_elements);
    }
  }
};

// The caches of one sequence: the model's factory (e.g. GPU caches) or the CPU's.
LayerCaches caches_for(const Model& model, const PerplexityOptions& options, const ResolvedKV& kv) {
  return options.make_caches ? options.make_caches(kv) : make_layer_caches(model.layer_specs(), kv);
}

// Feeds a chunk's C tokens at ids to one sequence's caches, `piece` tokens per forward: the
// logits of the piece from token `begin` go to out(begin), then scored(begin, n) runs.
template <class Out, class Scored>
void feed_chunk(const Model& model, const int32_t* ids, int64_t C, int piece, LayerCaches& caches,
                Out out, Scored scored) {
  for (int64_t begin = 0; begin < C; begin += piece) {
    const int n = int(std::min<int64_t>(piece, C - begin));
    Model::Chunk c{ids + begin, n, &caches, out(begin), true};
    model.forward({&c, 1});
    scored(begin, n);
  }
}

}  // namespace

PerplexityResult run_perplexity(
    const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& options,
    const std::function<void(int64_t, int64_t, const PerplexityStats&)>& progress) {
  const int64_t chunks = check_and_count_chunks(tokens, options);
  if (options.kv.scheme != KVScheme::kDense) {
    return run_perplexity_sweep(
               model, tokens, options, {options.kv},
               [&](int64_t done, int64_t total, const std::vector<PerplexityResult>& partial) {
                 if (progress) progress(done, total, partial.front().stats);
               })
        .front();
  }
  PerplexityResult result;
  result.chunks = chunks;
  const int64_t C = options.context;
  const int V = model.info().vocab_size;
  const int piece = options.tokens_per_forward;
  std::vector<float> logits(size_t(piece) * V);  // [piece, V]
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int32_t* ids = tokens.data() + chunk * C;
    LayerCaches dense = caches_for(model, options, ResolvedKV{});
    feed_chunk(
        model, ids, C, piece, dense, [&](int64_t) { return logits.data(); },
        [&](int64_t begin, int n) {
          score_logits(logits.data(), nullptr, ids + begin + 1, n, V, result.stats);
        });
    if (progress) progress(chunk + 1, chunks, result.stats);
  }
  return result;
}

std::vector<PerplexityResult> run_perplexity_sweep(
    const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& options,
    const std::vector<ResolvedKV>& kvs,
    const std::function<void(int64_t, int64_t, const std::vector<PerplexityResult>&)>& progress) {
  const int64_t chunks = check_and_count_chunks(tokens, options);
  if (kvs.empty()) throw InvalidArgument("a perplexity sweep needs at least one KV setting");
  std::vector<PerplexityResult> results(kvs.size());
  std::vector<KVSize> sizes(kvs.size());
  for (size_t i = 0; i < kvs.size(); ++i) {
    if (kvs[i].scheme == KVScheme::kDense) {
      throw InvalidArgument(str_cat("sweep setting ", i + 1,
                                    " is dense; every setting needs a "
                                    "KV scheme (the dense pass runs anyway)"));
    }
    results[i].chunks = chunks;
    results[i].quantized = true;
    results[i].kv_scheme = kv_scheme_name(kvs[i].scheme);
  }
  const int64_t C = options.context;
  const int V = model.info().vocab_size;
  const int piece = options.tokens_per_forward;
  // Every forward carries one sequence: the dense pass first, then each setting alone. A
  // setting's logits are then those of its single run, bit for bit (a batched forward is not:
  // some BLAS kernels round a row differently by its position in the batch).
  std::vector<float> dense_logits(size_t(C) * V);  // [C, V] of the chunk
  std::vector<float> logits(size_t(piece) * V);    // [piece, V]
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int32_t* ids = tokens.data() + chunk * C;
    {
      LayerCaches dense = caches_for(model, options, ResolvedKV{});
      feed_chunk(
          model, ids, C, piece, dense, [&](int64_t begin) { return &dense_logits[begin * V]; },
          [](int64_t, int) {});
    }
    for (size_t j = 0; j < kvs.size(); ++j) {
      const int n_first = int(std::min<int64_t>(piece, C));
      const ResolvedKV kv = allocate_kv(
          model.layer_specs(), kvs[j], n_first, V,
          [&](const std::vector<LayerCaches*>& caches, const std::vector<float*>& out) {
            std::vector<Model::Chunk> pass;
            for (size_t s = 0; s < caches.size(); ++s) {
              pass.push_back({ids, n_first, caches[s], out[s], true});
            }
            model.forward(pass);
          });
      if (kvs[j].allocation == KVAllocation::kAuto && chunk == 0) {
        results[j].kv_layer_bits = layer_bits_text(kv.layer_bits);
      }
      LayerCaches quant = caches_for(model, options, kv);
      feed_chunk(
          model, ids, C, piece, quant, [&](int64_t) { return logits.data(); },
          [&](int64_t begin, int n) {
            score_logits(logits.data(), &dense_logits[begin * V], ids + begin + 1, n, V,
                         results[j].stats);
          });
      sizes[j].add(quant);
    }
    if (progress) progress(chunk + 1, chunks, results);
  }
  for (size_t i = 0; i < kvs.size(); ++i) sizes[i].report(results[i]);
  return results;
}

}  // namespace turbokv
