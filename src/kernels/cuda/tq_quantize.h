// Fused TurboQuant quantize (key and value bits of the codec) of new tokens' keys and values straight into the paged tile
// format (tq_layout.h tiles inside kvcache/paged.h blocks): norm, rotation, codebook, norm
// correction, pack. Codes and norms are bit-identical to quant::MseCodec::quantize (the
// operation order of codec_mse.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kvcache/paged.h"
#include "kernels/cuda/tq_codec.h"

namespace turbokv::cuda {

struct TQQuantizeProblem {
  const float* k = nullptr;      // [rows, kv_heads, 128] fp32 (device)
  const float* v = nullptr;      // same shape
  const int* row_seq = nullptr;  // [rows] (device): the sequence (block table row) of each row
  const int* row_pos = nullptr;  // [rows] (device): its position in that sequence
  int rows = 0;
  int kv_heads = 0;
  uint8_t* const* block_table = nullptr;  // [sequences, table_stride] block pointers (device)
  int table_stride = 0;  // the caller guarantees row_pos / 256 < table_stride, block allocated
  // Optional (nullptr: not tracked): the largest value norm stored so far, as float bits
  // (atomicMax); the attention kernel scales its fp16 value operands by it.
  unsigned* value_norm_max = nullptr;
  // Optional [sequences] (device; nullptr: none): centering, the coded vector of a row is
  // x - float(mean) (fp32 subtraction, the CPU cache's) with its sequence's key_mean /
  // value_mean where set. The kernels read this array, row_seq, row_pos and the block table
  // before their PDL wait: the host writes them, never a kernel of the step (a kernel may write
  // the means they point to).
  const TQSequenceState* states = nullptr;
};

// Throws InvalidArgument for non-positive shapes. Rows may be written in any order; other
// tokens sharing a tile are left untouched.
void tq_quantize(const TQKernelCodec& codec, const TQQuantizeProblem& problem, cudaStream_t stream);

// The same quantize straight from a fused QKV projection's output, with qkv_post's bias and
// rotate-half RoPE (model_ops.h; no q/k norm), in one kernel: queries are written to q, keys
// and values go into the cache with no fp32 copy. The codes are those tq_quantize gives the
// k and v qkv_post computes (the RoPE arithmetic is rope.cuh's in both).
struct TQRopeQuantizeProblem {
  const float* qkv = nullptr;  // [rows, (heads + 2 kv_heads) * 128] (device)
  const float* bias = nullptr;  // [(heads + 2 kv_heads) * 128] or null
  const int32_t* positions = nullptr;  // [rows] RoPE positions
  const float* inv_freq = nullptr;     // [rotary_dim / 2]
  int rotary_dim = 0;                  // a multiple of 8, <= 128 (0: no rotation)
  float attention_scaling = 1;
  int heads = 0;
  float* q = nullptr;  // [rows, heads, 128]
  TQQuantizeProblem cache;  // rows, kv_heads, row_seq, row_pos, block table (k, v unused)
};
bool tq_rope_quantize_supported(int rotary_dim);
// Throws InvalidArgument for non-positive shapes or an unsupported rotary_dim.
void tq_rope_quantize(const TQKernelCodec& codec, const TQRopeQuantizeProblem& problem,
                      cudaStream_t stream);

}  // namespace turbokv::cuda
