// Whole-model GPU benchmarks (`turbokv bench e2e --device cuda`, bench/cuda/e2e_bench.py):
// decode tokens/s of a batch at a cache depth, prefill tokens/s, and the longest context one
// sequence's caches fit in the KV pool. Caches are filled to the depth without a prefill: the
// first block of every layer's cache gets random keys and values through the cache's own
// append kernels (quantized like real ones), the other blocks are copies of it; the timed
// decode steps then run the real forward (CUDA graphs included).
#pragma once

#include <cstdint>

#include "model/cuda/cuda_decoder.h"

namespace turbokv::eval {

struct GpuDecodeResult {
  int batch = 0;
  int64_t depth = 0;        // cached tokens per sequence when timing started
  double tokens_per_s = 0;  // batch * steps / seconds
  double ms_per_step = 0;
  size_t kv_bytes = 0;        // one sequence's caches at the end (exact state bytes)
  size_t kv_bytes_dense = 0;  // their fp16 equivalent
};

GpuDecodeResult gpu_decode(const cuda::CudaDecoderModel& model, const ResolvedKV& kv, int batch,
                           int64_t depth, int warmup, int steps);

// One prompt of `tokens` random ids, fed in chunks of `chunk` tokens (the engine's prefill).
double gpu_prefill_tokens_per_s(const cuda::CudaDecoderModel& model, const ResolvedKV& kv,
                                int tokens, int chunk = 256);

// The most tokens one sequence's caches for kv hold in the model's KV pool (every block they
// would need allocated at once).
int64_t gpu_max_depth(const cuda::CudaDecoderModel& model, const ResolvedKV& kv);

}  // namespace turbokv::eval
