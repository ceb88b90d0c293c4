// Perplexity and KV-cache quality against the dense cache (perplexity.h).
#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kv/cache_policy.h"

namespace turbokv {
namespace {

// log-softmax of one row, in double: out[i] = x[i] - logsumexp(x).
void log_softmax(const float* x, int n, std::vector<double>& out) {
  out.resize(size_t(n));
  const double max = *std::max_element(x, x + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - max);
  const double log_z = max + std::log(sum);
  for (int i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - log_z;
}

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
      double kl = 0;
      for (int i = 0; i < vocab; ++i) {
        kl += std::exp(dense_logp[size_t(i)]) * (dense_logp[size_t(i)] - logp[size_t(i)]);
      }
      stats.kld_sum += kl;
      stats.top1_agree += std::max_element(row, row + vocab) - row ==
                          std::max_element(dense_row, dense_row + vocab) - dense_row;
    }
    ++stats.tokens;
  }
}

PerplexityResult run_perplexity(
    const Model& model, std::span<const int32_t> tokens, const PerplexityOptions& options,
    const std::function<void(int64_t, int64_t, const PerplexityStats&)>& progress) {
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
  PerplexityResult result;
  result.chunks = (int64_t(tokens.size()) - 1) / C;
  if (result.chunks < 1) {
    throw InvalidArgument(str_cat("the text has ", tokens.size(), " tokens; one chunk of context ",
                                  C, " needs ", C + 1));
  }
  if (options.max_chunks > 0) result.chunks = std::min(result.chunks, options.max_chunks);
  const ResolvedKV& kv = options.kv;
  result.quantized = kv.scheme != KVScheme::kDense;
  result.kv_scheme = kv_scheme_name(kv.scheme);

  const int V = model.info().vocab_size;
  const int piece = options.tokens_per_forward;
  std::vector<float> logits(size_t(piece) * V), dense_logits(size_t(piece) * V);  // [piece, V]
  size_t quant_bytes = 0;
  int64_t quant_elements = 0;  // tokens · kv_heads · d · 2 over quantized layers
  for (int64_t chunk = 0; chunk < result.chunks; ++chunk) {
    const int32_t* ids = tokens.data() + chunk * C;
    const CacheFactory make_caches =
        options.make_caches ? options.make_caches : [&model](const ResolvedKV& r) {
          return make_layer_caches(model.layer_specs(), r);
        };
    LayerCaches dense = make_caches(ResolvedKV{});
    LayerCaches quant;
    if (result.quantized) quant = make_caches(kv);
    for (int64_t begin = 0; begin < C; begin += piece) {
      const int n = int(std::min<int64_t>(piece, C - begin));
      std::vector<Model::Chunk> batch;
      batch.push_back({ids + begin, n, &dense, dense_logits.data(), true});
      if (result.quantized) batch.push_back({ids + begin, n, &quant, logits.data(), true});
      model.forward(batch);
      if (result.quantized) {
        score_logits(logits.data(), dense_logits.data(), ids + begin + 1, n, V, result.stats);
      } else {
        score_logits(dense_logits.data(), nullptr, ids + begin + 1, n, V, result.stats);
      }
    }
    for (const auto& c : quant) {
      if (!is_quantized(*c)) continue;
      quant_bytes += c->nbytes();
      quant_elements += c->size() * c->kv_heads() * c->head_dim() * 2;
    }
    if (progress) progress(chunk + 1, result.chunks, result.stats);
  }
  if (quant_elements > 0)
    result.kv_bits_effective = 8.0 * double(quant_bytes) / double(quant_elements);
  return result;
}

}  // namespace turbokv
