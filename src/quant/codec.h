// The TurboQuant codec interface shared by the MSE codec (integer bits) and the split codec
// (k + 0.5 bits), so KV caches and attention code against one API. A vector's state is its
// packed codes (code_bytes() bytes) plus norms_per_vector() fp16 norms, kept in two arrays:
//   codes [n, code_bytes()]   norms [n, norms_per_vector()] (fp16 bits)
//
// Attention runs on codes (docs/design.md, "TurboQuant"): rotate the query once (rotate_query, into
// the codec's rotated frame of rotated_dim() floats), score() every key, accumulate() weighted
// values in the rotated frame, unrotate() the sum once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "quant/isa.h"

namespace turbokv::quant {

class TurboQuantCodec {
 public:
  virtual ~TurboQuantCodec() = default;

  virtual int dim() const = 0;
  virtual double bits() const = 0;  // per element, excluding norms (e.g. 3 or 3.5)
  virtual size_t code_bytes() const = 0;
  virtual int norms_per_vector() const = 0;
  // Bytes one vector occupies: codes + 2 bytes per norm.
  size_t bytes_per_vector() const { return code_bytes() + 2 * size_t(norms_per_vector()); }
  // Length of a rotated query / accumulator (== dim()).
  int rotated_dim() const { return dim(); }

  // x [dim] -> codes [code_bytes], norms [norms_per_vector].
  virtual void quantize(const float* x, uint8_t* codes, uint16_t* norms,
                        Isa isa = best_isa()) const = 0;
  // codes, norms -> x [dim].
  virtual void dequantize(const uint8_t* codes, const uint16_t* norms, float* x) const = 0;

  // x [n, dim] -> codes [n, code_bytes], norms [n, norms_per_vector]; multi-threaded over
  // vectors (parallel_for), each vector coded exactly as quantize() codes it.
  void quantize_batch(const float* x, int64_t n, uint8_t* codes, uint16_t* norms,
                      Isa isa = best_isa()) const;
  // codes [n, code_bytes], norms [n, norms_per_vector] -> x [n, dim]; multi-threaded.
  void dequantize_batch(const uint8_t* codes, const uint16_t* norms, int64_t n, float* x) const;

  // rq [rotated_dim] = the query in the rotated frame.
  virtual void rotate_query(const float* q, float* rq, Isa isa = best_isa()) const = 0;
  // scores [n]: scores[t] = <q, dequantize(vector t)>, computed from rq and the codes.
  void score(const float* rq, const uint8_t* codes, const uint16_t* norms, int64_t n, float* scores,
             Isa isa = best_isa()) const {
    score_multi(rq, 1, codes, norms, n, scores, isa);
  }
  // acc [rotated_dim] += Σ_t weights[t] · (vector t in the rotated frame).
  void accumulate(const float* weights, const uint8_t* codes, const uint16_t* norms, int64_t n,
                  float* acc, Isa isa = best_isa()) const {
    accumulate_multi(weights, 1, codes, norms, n, acc, isa);
  }
  // The same for the n_queries query heads that share one KV head (GQA), in one pass over the
  // codes: rq [n_queries, rotated_dim] -> scores [n_queries, n];
  // weights [n_queries, n] -> acc [n_queries, rotated_dim] (+=).
  virtual void score_multi(const float* rq, int n_queries, const uint8_t* codes,
                           const uint16_t* norms, int64_t n, float* scores,
                           Isa isa = best_isa()) const = 0;
  virtual void accumulate_multi(const float* weights, int n_queries, const uint8_t* codes,
                                const uint16_t* norms, int64_t n, float* acc,
                                Isa isa = best_isa()) const = 0;
  // out [dim] = acc taken back from the rotated frame (so out = Σ_t w_t dequantize(t)).
  virtual void unrotate(const float* acc, float* out, Isa isa = best_isa()) const = 0;
};

enum class TensorRole { kKey, kValue };

struct TurboQuantConfig {
  int dim = 0;
  double bits = 0;  // multiple of 0.5 in [1, 8]; k + 0.5 selects the split codec
  uint64_t seed = 0;
  TensorRole role = TensorRole::kKey;
  bool norm_correction = true;
  // Split codec only: [dim] channel permutation, the first round(dim/2) are the "high"
  // (k+1 bits) half. Empty -> channels in natural order. See choose_split_channels().
  std::vector<int> channel_order;
  bool unbiased_norm = false;  // stored norm n / <y, C[idx]> (codec_mse.h step 5)
};

// MseCodec for integer bits, SplitCodec for k + 0.5. Throws InvalidArgument naming the bad
// value (bits 0, 9, 2.25; dim < 2; a channel_order that is not a permutation).
std::unique_ptr<TurboQuantCodec> make_turboquant_codec(const TurboQuantConfig& config);

// Validates TurboQuant bits: multiple of 0.5 in [1, 8]. Throws InvalidArgument otherwise, naming
// the value as `what` (also its param()).
void check_turboquant_bits(double bits, const char* what = "bits");

}  // namespace turbokv::quant
