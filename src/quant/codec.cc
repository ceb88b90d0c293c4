// Batch helpers of the TurboQuant codec interface and the bits -> codec factory.
#include "quant/codec.h"

#include <cmath>

#include "core/error.h"
#include "core/threads.h"
#include "quant/codec_mse.h"
#include "quant/codec_split.h"

namespace turbokv::quant {

void TurboQuantCodec::quantize_batch(const float* x, int64_t n, uint8_t* codes, uint16_t* norms,
                                     Isa isa) const {
  const size_t cb = code_bytes();
  const int nn = norms_per_vector();
  parallel_for(n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      quantize(x + t * dim(), codes + t * cb, norms + t * nn, isa);
    }
  });
}

void TurboQuantCodec::dequantize_batch(const uint8_t* codes, const uint16_t* norms, int64_t n,
                                       float* x) const {
  const size_t cb = code_bytes();
  const int nn = norms_per_vector();
  parallel_for(n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) dequantize(codes + t * cb, norms + t * nn, x + t * dim());
  });
}

void check_turboquant_bits(double bits, const char* what) {
  if (!(bits >= 1 && bits <= 8) || std::floor(bits * 2) != bits * 2) {
    throw InvalidArgument(str_cat(what, "=", bits,
                                  " is not valid for TurboQuant: allowed are multiples of 0.5 "
                                  "in [1, 8] (e.g. 2, 2.5, 3, 3.5, 4)"),
                          what);
  }
}

std::unique_ptr<TurboQuantCodec> make_turboquant_codec(const TurboQuantConfig& config) {
  check_turboquant_bits(config.bits);
  const bool key = config.role == TensorRole::kKey;
  if (std::floor(config.bits) == config.bits) {
    if (!config.channel_order.empty()) {
      throw InvalidArgument(
          str_cat("a channel order is only used by fractional bits, got bits ", config.bits));
    }
    return std::make_unique<MseCodec>(
        MseCodecConfig{config.dim, int(config.bits), config.seed,
                       key ? RotationRole::kKey : RotationRole::kValue, config.norm_correction,
                       config.unbiased_norm});
  }
  SplitCodecConfig split;
  split.dim = config.dim;
  split.low_bits = int(std::floor(config.bits));
  split.seed = config.seed;
  split.role = config.role;
  split.norm_correction = config.norm_correction;
  split.unbiased_norm = config.unbiased_norm;
  split.channel_order = config.channel_order;
  return std::make_unique<SplitCodec>(split);
}

}  // namespace turbokv::quant
