// A TurboQuant codec pair of the fused kernels (integer-bit keys and values, 2..4 bits each,
// d = 128; tq_layout.h) as the CUDA kernels see it. Everything comes from the CPU codecs in
// src/quant (same seed, same rotations and Lloyd-Max codebooks); this only repackages their
// parameters into a by-value kernel argument.
#pragma once

#include <cstdint>
#include <memory>

#include "quant/codec_mse.h"

namespace turbokv::cuda {

// Kernel argument (passed by value, lives in the constant bank).
struct TQKernelCodec {
  int key_bits;  // 2..4: the first 2^bits centroids, 2^bits - 1 boundaries hold
  int value_bits;
  float key_centroids[16];
  float key_boundaries[15];
  float value_centroids[16];
  float value_boundaries[15];
  float hadamard_scale;          // float(1/sqrt(128)), the rotation's scale
  uint32_t key_sign_flips[4];    // bit i of the 128-bit mask: dim i flips sign (keys)
  uint32_t value_sign_flips[4];  // same for values
  // Stored norm (codec_mse.h step 5): 1: |x| / |c[idx]|, 2: |x| / <y, c[idx]> (unbiased), 0: |x|.
  int norm_correction;
};

class TQDeviceCodec {
 public:
  // Throws InvalidArgument if the quant library rejects the configuration, Unsupported for bits
  // without a tile format (TQTileLayout::supported).
  explicit TQDeviceCodec(uint64_t seed = 0, bool norm_correction = true, int key_bits = 3,
                         int value_bits = 4, bool unbiased_norm = false);

  const quant::MseCodec& key_codec() const { return *key_; }
  const quant::MseCodec& value_codec() const { return *value_; }
  const TQKernelCodec& kernel_codec() const { return kernel_; }

 private:
  std::unique_ptr<quant::MseCodec> key_;
  std::unique_ptr<quant::MseCodec> value_;
  TQKernelCodec kernel_{};
};

}  // namespace turbokv::cuda
