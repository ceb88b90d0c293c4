// Launchers of the attention kernels (one translation unit each); the public entry points
// that plan the split grid are in attention.h. Each launch also merges its splits.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tq_codec.h"

namespace turbokv::cuda::attn {

// grid (splits, kv_heads * row_groups, batch); the paged cache of args.block_table, in the
// tile format of codec.key_bits / codec.value_bits. One block of 12 warps per SM. Throws
// Unsupported for bits without a kernel (TQTileLayout::supported and not instantiated).
void launch_tq_attention(const AttentionArgs& args, const TQKernelCodec& codec, int batch,
                         cudaStream_t stream);
// One per instantiated (key bits, value bits), tq_attention_k*v*.cu. K3/V4 and K4/V3 (what
// --kv-bits 3.5 gives) also have a programmatic-launch (PDL) instantiation; the others run a
// PDL request as a plain launch.
#define TURBOKV_TQ_ATTENTION_BITS(X) X(3, 4) X(4, 3) X(4, 4) X(3, 3) X(2, 3) X(3, 2)
#define TURBOKV_DECLARE_TQ_ATTENTION(kb, vb)                                                   \
  void launch_tq_attention_k##kb##v##vb(const AttentionArgs& args, const TQKernelCodec& codec, \
                                      int batch, cudaStream_t stream);
TURBOKV_TQ_ATTENTION_BITS(TURBOKV_DECLARE_TQ_ATTENTION)
#undef TURBOKV_DECLARE_TQ_ATTENTION

// The paged fp16 cache of args.block_table.
void launch_dense_attention(const AttentionArgs& args, int batch, cudaStream_t stream);
int dense_attention_blocks_per_sm();

// Launches `kernel` on `grid` x `threads` with `smem` bytes of dynamic shared memory, with
// programmatic dependent launch when args.programmatic is set.
template <typename... Params, typename... Args>
void launch_attention_kernel(void (*kernel)(Params...), dim3 grid, int threads, int smem,
                             cudaStream_t stream, const AttentionArgs& args, Args&&... rest) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = args.programmatic ? 1 : 0;
  TURBOKV_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args, std::forward<Args>(rest)...));
}

}  // namespace turbokv::cuda::attn
