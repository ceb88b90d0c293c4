// The TurboQuant 3.5 codec pair (keys 3-bit, values 4-bit, d = 128) as the CUDA kernels see
// it. Everything comes from the CPU codecs in src/quant (same seed, same rotations and
// Lloyd-Max codebooks); this only repackages their parameters into a by-value kernel argument.
#pragma once

#include <cstdint>
#include <memory>

#include "quant/codec_mse.h"

namespace turbokv::cuda {

// Kernel argument (passed by value, lives in the constant bank).
struct TQKernelCodec {
  float key_centroids[8];
  float key_boundaries[7];
  float value_centroids[16];
  float value_boundaries[15];
  float hadamard_scale;          // float(1/sqrt(128)), the rotation's scale
  uint32_t key_sign_flips[4];    // bit i of the 128-bit mask: dim i flips sign (keys)
  uint32_t value_sign_flips[4];  // same for values
  int norm_correction;           // 1: stored norm = |x| / |c[idx]| (codec_mse.h step 5)
};

class TQDeviceCodec {
 public:
  // Throws InvalidArgument if the quant library rejects the configuration.
  explicit TQDeviceCodec(uint64_t seed = 0, bool norm_correction = true);

  const quant::MseCodec& key_codec() const { return *key_; }
  const quant::MseCodec& value_codec() const { return *value_; }
  const TQKernelCodec& kernel_codec() const { return kernel_; }

 private:
  std::unique_ptr<quant::MseCodec> key_;
  std::unique_ptr<quant::MseCodec> value_;
  TQKernelCodec kernel_{};
};

}  // namespace turbokv::cuda
