// Launches of the model's kernels with programmatic dependent launch (PDL): a kernel launched
// so may be scheduled while the kernel before it on the stream is still finishing, which hides
// the launch gap between the many small kernels of a decode step (also inside a CUDA graph).
// Every kernel launched through launch_pdl calls pdl_wait() in every block before any early
// return and before touching memory a kernel may write: it then reads and writes such memory
// only once the previous kernel has completed and its writes are visible, so results are those
// of a plain launch. Before the wait a kernel may read only what the host wrote for the step
// (positions, rows, block tables: uploaded before the step's first kernel, which starts only
// once the upload is done).
// pdl_release() lets the next kernel be scheduled; kernels call it where they no longer need
// the SMs to themselves (small kernels at once, streaming kernels after their main loop).
// TURBOKV_PDL=0 in the environment: plain launches (debugging, and the benchmark's comparison).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {

// Whether launch_pdl sets the PDL attribute (read once from TURBOKV_PDL).
bool programmatic_launch_enabled();

#ifdef __CUDACC__
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_release() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic_launch_enabled() ? 1 : 0;
  TURBOKV_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}
#endif

}  // namespace turbokv::cuda
