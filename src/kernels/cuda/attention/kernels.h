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

// grid (splits, kv_heads * row_groups, batch); the paged cache of args.block_table.
// One block of 12 warps per SM.
void launch_tq_attention(const AttentionArgs& args, const TQKernelCodec& codec, int batch,
                         cudaStream_t stream);

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
