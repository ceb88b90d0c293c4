// Fused TurboQuant 3.5 quantize of new tokens' keys and values straight into the device tile
// format (tq_layout.h): norm, rotation, codebook, norm correction, pack. Codes and norms are
// bit-identical to quant::MseCodec::quantize (the operation order of codec_mse.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/tq_codec.h"

namespace turbokv::cuda {

struct TQQuantizeProblem {
  const float* k = nullptr;    // [batch, n_new, kv_heads, 128] fp32 (device)
  const float* v = nullptr;    // same shape
  const int* start = nullptr;  // [batch] (device): position of each sequence's first new token
  uint8_t* tiles = nullptr;    // [batch, kv_heads, max_tiles, 3712 B] (device)
  int batch = 0;
  int n_new = 0;
  int kv_heads = 0;
  int max_tiles = 0;  // the caller guarantees start[b] + n_new <= 32 * max_tiles
};

// Throws InvalidArgument for non-positive shapes. Tokens may be written in any order; other
// tokens sharing a tile are left untouched.
void tq_quantize(const TQKernelCodec& codec, const TQQuantizeProblem& problem, cudaStream_t stream);

}  // namespace turbokv::cuda
