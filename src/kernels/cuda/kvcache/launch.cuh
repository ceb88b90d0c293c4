// Host-side launch of the paged kernels (one place for the launch syntax and its check).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda::paged {

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  TURBOKV_CUDA_CHECK_LAUNCH();
}

// Lets `kernel` take up to `bytes` of dynamic shared memory (once per kernel and process).
template <typename... Params>
void allow_dynamic_smem(void (*kernel)(Params...), int bytes) {
  TURBOKV_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace turbokv::cuda::paged
