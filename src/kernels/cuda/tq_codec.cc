// Builds the kernel-side codec parameters from the CPU codecs (no second codebook/rotation).
#include "kernels/cuda/tq_codec.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/tq_layout.h"

namespace turbokv::cuda {
namespace {

template <size_t N>
void copy_exact(const std::vector<float>& from, size_t n, float (&to)[N], const char* what) {
  if (from.size() != n || n > N) {
    throw Error(str_cat("TQDeviceCodec: ", what, " has ", from.size(), " entries, expected ", n));
  }
  std::fill(std::begin(to), std::end(to), 0.0f);
  std::copy(from.begin(), from.end(), to);
}

void copy_sign_flips(const quant::Rotation& rotation, uint32_t (&bits)[4]) {
  if (!rotation.is_hadamard() || rotation.dim() != TQ35Layout::kHeadDim) {
    throw Unsupported("CUDA TurboQuant needs the d=128 Hadamard rotation");
  }
  std::fill(std::begin(bits), std::end(bits), 0u);
  for (int i = 0; i < rotation.dim(); ++i) {
    if (rotation.sign_flips()[i]) bits[i / 32] |= 1u << (i % 32);
  }
}

}  // namespace

TQDeviceCodec::TQDeviceCodec(uint64_t seed, bool norm_correction, int key_bits, int value_bits,
                             bool unbiased_norm) {
  if (!TQTileLayout::supported(key_bits, value_bits)) {
    throw Unsupported(str_cat("CUDA TurboQuant: K", key_bits, "/V", value_bits,
                              " has no fused kernel (key and value bits 2..4)"));
  }
  quant::MseCodecConfig config;
  config.dim = TQ35Layout::kHeadDim;
  config.seed = seed;
  config.norm_correction = norm_correction;
  config.unbiased_norm = unbiased_norm;
  config.bits = key_bits;
  config.role = quant::RotationRole::kKey;
  key_ = std::make_unique<quant::MseCodec>(config);
  config.bits = value_bits;
  config.role = quant::RotationRole::kValue;
  value_ = std::make_unique<quant::MseCodec>(config);

  kernel_.key_bits = key_bits;
  kernel_.value_bits = value_bits;
  const size_t key_levels = size_t(1) << key_bits, value_levels = size_t(1) << value_bits;
  copy_exact(key_->codebook().centroids, key_levels, kernel_.key_centroids, "key centroids");
  copy_exact(key_->codebook().boundaries, key_levels - 1, kernel_.key_boundaries, "key boundaries");
  copy_exact(value_->codebook().centroids, value_levels, kernel_.value_centroids,
             "value centroids");
  copy_exact(value_->codebook().boundaries, value_levels - 1, kernel_.value_boundaries,
             "value boundaries");
  kernel_.hadamard_scale = key_->rotation().hadamard_scale();
  copy_sign_flips(key_->rotation(), kernel_.key_sign_flips);
  copy_sign_flips(value_->rotation(), kernel_.value_sign_flips);
  kernel_.norm_correction = unbiased_norm ? 2 : norm_correction ? 1 : 0;
}

}  // namespace turbokv::cuda
