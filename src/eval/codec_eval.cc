// Codec measurements for `turbokv codec` (see codec_eval.h).
#include "eval/codec_eval.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "quant/codec.h"
#include "quant/codec_mse.h"
#include "quant/codec_prod.h"
#include "quant/codec_split.h"
#include "quant/codec_uniform.h"

namespace turbokv::eval {

using namespace quant;

namespace {

// Sums that measure_codec accumulates per thread and merges.
struct Sums {
  double sq_err = 0, sq_err_corrected = 0, err_dot_true = 0, true_sq = 0, err_sq_per_qnorm = 0;
  int64_t queries = 0;
  void merge(const Sums& o) {
    sq_err += o.sq_err;
    sq_err_corrected += o.sq_err_corrected;
    err_dot_true += o.err_dot_true;
    true_sq += o.true_sq;
    err_sq_per_qnorm += o.err_sq_per_qnorm;
    queries += o.queries;
  }
};

double sq_distance(const float* a, const float* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return s;
}

}  // namespace

void check_codec_mode_bits(const std::string& mode, double bits) {
  if (mode != "mse" && mode != "prod") {
    throw InvalidArgument(str_cat("codec mode '", mode, "' is unknown: allowed mse, prod"));
  }
  if (mode == "mse") {
    check_turboquant_bits(bits);
  } else if (!(bits >= 1 && bits <= 8) || std::floor(bits) != bits) {
    throw InvalidArgument(str_cat("prod codec bits ", bits, " is invalid: allowed 1..8"));
  }
}

CodecStats measure_codec(int dim, double bits, const std::string& mode, int64_t samples,
                         int queries_per_vector, uint64_t seed) {
  check_codec_mode_bits(mode, bits);
  if (samples < 1) throw InvalidArgument(str_cat("samples ", samples, " is invalid: need >= 1"));
  const bool prod = mode == "prod";
  std::unique_ptr<TurboQuantCodec> plain, corrected;
  std::unique_ptr<ProdCodec> prod_codec;
  if (prod) {
    prod_codec = std::make_unique<ProdCodec>(ProdCodecConfig{dim, int(bits), seed});
  } else {
    plain = make_turboquant_codec({dim, bits, seed, TensorRole::kKey, false, {}});
    corrected = make_turboquant_codec({dim, bits, seed, TensorRole::kKey, true, {}});
  }

  std::mutex mu;
  Sums total;
  const int64_t block = 256;  // vectors per RNG stream: results do not depend on threads
  parallel_for((samples + block - 1) / block, 1, [&](int64_t begin, int64_t end) {
    Sums sums;
    std::vector<float> x(dim), back(dim), q(dim), prepared(2 * dim);
    std::vector<uint8_t> codes(prod ? prod_codec->code_bytes() : plain->code_bytes());
    std::vector<uint16_t> norms(2);
    for (int64_t b = begin; b < end; ++b) {
      Xoshiro256 rng(derive_seed(seed, uint64_t(dim), 1000 + uint64_t(b)));
      for (int64_t s = b * block; s < std::min(samples, (b + 1) * block); ++s) {
        double norm = 0;
        for (auto& v : x) {
          v = float(rng.gaussian());
          norm += double(v) * v;
        }
        for (auto& v : x) v = float(v / std::sqrt(norm));
        if (prod) {
          prod_codec->quantize(x.data(), codes.data(), norms.data());
          prod_codec->dequantize(codes.data(), norms.data(), back.data());
        } else {
          corrected->quantize(x.data(), codes.data(), norms.data());
          corrected->dequantize(codes.data(), norms.data(), back.data());
          sums.sq_err_corrected += sq_distance(back.data(), x.data(), dim);
          plain->quantize(x.data(), codes.data(), norms.data());
          plain->dequantize(codes.data(), norms.data(), back.data());
        }
        sums.sq_err += sq_distance(back.data(), x.data(), dim);
        for (int j = 0; j < queries_per_vector; ++j) {
          double q_norm_sq = 0, truth = 0;
          for (int i = 0; i < dim; ++i) {
            q[i] = float(rng.gaussian());
            q_norm_sq += double(q[i]) * q[i];
            truth += double(q[i]) * x[i];
          }
          float estimate;
          if (prod) {
            prod_codec->prepare_query(q.data(), prepared.data());
            prod_codec->score(prepared.data(), codes.data(), norms.data(), 1, &estimate);
          } else {
            plain->rotate_query(q.data(), prepared.data());
            plain->score(prepared.data(), codes.data(), norms.data(), 1, &estimate);
          }
          const double err = double(estimate) - truth;
          sums.err_dot_true += err * truth;
          sums.true_sq += truth * truth;
          sums.err_sq_per_qnorm += err * err / q_norm_sq;
          ++sums.queries;
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    total.merge(sums);
  });

  CodecStats stats;
  stats.bits = bits;
  stats.mode = mode;
  stats.mse = total.sq_err / double(samples);
  stats.mse_norm_corrected = prod ? 0 : total.sq_err_corrected / double(samples);
  if (total.queries > 0) {
    stats.ip_bias = total.err_dot_true / total.true_sq;
    stats.ip_var_times_d = dim * total.err_sq_per_qnorm / double(total.queries);
  }
  return stats;
}

namespace {

// scores [n] -> softmax probabilities, in place.
void softmax_in_place(float* scores, int n) {
  const float m = *std::max_element(scores, scores + n);
  double sum = 0;
  for (int t = 0; t < n; ++t) {
    scores[t] = std::exp(scores[t] - m);
    sum += scores[t];
  }
  const float inv = float(1.0 / sum);
  for (int t = 0; t < n; ++t) scores[t] *= inv;
}

// One KV head's tensor through a codec: codes + norms (TurboQuant) or codes + params (uniform).
struct CodedHead {
  std::unique_ptr<TurboQuantCodec> turbo;
  std::unique_ptr<UniformCodec> uniform;
  std::vector<uint8_t> codes;    // [T, code_bytes]
  std::vector<uint16_t> extras;  // [T, norms or params per vector]

  int rotated_dim(int dim) const { return turbo ? turbo->rotated_dim() : dim; }
  void prepare(const float* q, float* rq) const {
    if (turbo) {
      turbo->rotate_query(q, rq);
    } else {
      std::copy(q, q + uniform->dim(), rq);
    }
  }
  void score(const float* rq, int n, float* scores) const {
    if (turbo) {
      turbo->score(rq, codes.data(), extras.data(), n, scores);
    } else {
      uniform->score(rq, codes.data(), extras.data(), n, scores);
    }
  }
  void accumulate(const float* w, int n, float* acc) const {
    if (turbo) {
      turbo->accumulate(w, codes.data(), extras.data(), n, acc);
    } else {
      uniform->accumulate(w, codes.data(), extras.data(), n, acc);
    }
  }
  void finish(const float* acc, float* out) const {
    if (turbo) {
      turbo->unrotate(acc, out);
    } else {
      std::copy(acc, acc + uniform->dim(), out);
    }
  }
};

CodedHead code_head(const float* x, int tokens, int dim, const ResolvedKV& kv, bool key,
                    int calibration_tokens) {
  CodedHead head;
  const double bits = key ? kv.key_bits : kv.value_bits;
  if (kv.scheme == KVScheme::kTurboQuant) {
    TurboQuantConfig config{
        dim, bits, kv.seed, key ? TensorRole::kKey : TensorRole::kValue, kv.norm_correction, {}};
    if (std::floor(bits) != bits) {
      config.channel_order = choose_split_channels(x, std::min(tokens, calibration_tokens), dim);
    }
    head.turbo = make_turboquant_codec(config);
    head.codes.resize(size_t(tokens) * head.turbo->code_bytes());
    head.extras.resize(size_t(tokens) * head.turbo->norms_per_vector());
    head.turbo->quantize_batch(x, tokens, head.codes.data(), head.extras.data());
  } else {
    head.uniform =
        std::make_unique<UniformCodec>(UniformCodecConfig{dim, int(bits), kv.group_size});
    head.codes.resize(size_t(tokens) * head.uniform->code_bytes());
    head.extras.resize(size_t(tokens) * head.uniform->params_per_vector());
    head.uniform->quantize_batch(x, tokens, head.codes.data(), head.extras.data());
  }
  return head;
}

}  // namespace

LayerFidelity attention_fidelity(const float* q, const float* k, const float* v, int n_heads,
                                 int kv_heads, int tokens, int dim, const ResolvedKV& kv,
                                 int split_calibration_tokens) {
  if (kv.scheme == KVScheme::kDense) {
    throw InvalidArgument("attention fidelity needs a quantized KV scheme: give --kv-bits");
  }
  if (kv_heads < 1 || n_heads % kv_heads != 0) {
    throw InvalidArgument(
        str_cat("query heads ", n_heads, " is not a multiple of KV heads ", kv_heads));
  }
  const float scale = float(1.0 / std::sqrt(double(dim)));
  std::vector<CodedHead> keys, values;
  for (int h = 0; h < kv_heads; ++h) {
    const size_t offset = size_t(h) * tokens * dim;
    keys.push_back(code_head(k + offset, tokens, dim, kv, true, split_calibration_tokens));
    values.push_back(code_head(v + offset, tokens, dim, kv, false, split_calibration_tokens));
  }
  const int group = n_heads / kv_heads;
  std::mutex mu;
  double cosine_sum = 0, rel_l2_sum = 0;
  parallel_for(int64_t(n_heads) * tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(tokens), exact_scores(tokens), rq(dim), acc(dim), out(dim),
        exact(dim, 0.0f);
    double cos_local = 0, rel_local = 0;
    for (int64_t row = begin; row < end; ++row) {
      const int head = int(row / tokens), p = int(row % tokens), kvh = head / group;
      const float* qp = q + (size_t(head) * tokens + p) * dim;
      const float* kh = k + size_t(kvh) * tokens * dim;
      const float* vh = v + size_t(kvh) * tokens * dim;
      for (int t = 0; t <= p; ++t) {
        double dot = 0;
        for (int i = 0; i < dim; ++i) dot += double(qp[i]) * kh[size_t(t) * dim + i];
        exact_scores[t] = float(dot) * scale;
      }
      softmax_in_place(exact_scores.data(), p + 1);
      std::fill(exact.begin(), exact.end(), 0.0f);
      for (int t = 0; t <= p; ++t) {
        for (int i = 0; i < dim; ++i) exact[i] += exact_scores[t] * vh[size_t(t) * dim + i];
      }
      keys[kvh].prepare(qp, rq.data());
      keys[kvh].score(rq.data(), p + 1, scores.data());
      for (int t = 0; t <= p; ++t) scores[t] *= scale;
      softmax_in_place(scores.data(), p + 1);
      std::fill(acc.begin(), acc.end(), 0.0f);
      values[kvh].accumulate(scores.data(), p + 1, acc.data());
      values[kvh].finish(acc.data(), out.data());
      double dot = 0, nq = 0, ne = 0, diff = 0;
      for (int i = 0; i < dim; ++i) {
        dot += double(out[i]) * exact[i];
        nq += double(out[i]) * out[i];
        ne += double(exact[i]) * exact[i];
        diff += (double(out[i]) - exact[i]) * (double(out[i]) - exact[i]);
      }
      cos_local += dot / std::sqrt(std::max(nq * ne, 1e-300));
      rel_local += std::sqrt(diff / std::max(ne, 1e-300));
    }
    std::lock_guard<std::mutex> lock(mu);
    cosine_sum += cos_local;
    rel_l2_sum += rel_local;
  });
  LayerFidelity result;
  result.attn_cosine = cosine_sum / (double(n_heads) * tokens);
  result.attn_rel_l2 = rel_l2_sum / (double(n_heads) * tokens);
  return result;
}

}  // namespace turbokv::eval
