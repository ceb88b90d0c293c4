// Device primitives of the paged kernels that are not plain CUDA C++: the dynamic shared
// memory, and cp.async copies (global -> shared without registers) of 16, 8 or 4 bytes.
#pragma once

#include <cstdint>

namespace turbokv::cuda::paged {

// The kernel's dynamic shared memory (16-B aligned).
__device__ __forceinline__ uint8_t* dynamic_smem() {
  extern __shared__ __align__(16) uint8_t smem[];
  return smem;
}

// Queues a copy of `unit` bytes (16, 8 or 4; both addresses aligned to it).
__device__ __forceinline__ void copy_async(uint8_t* dst, const uint8_t* src, int unit) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if (unit == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  } else if (unit == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
  }
}

// Closes the group of copies queued since the last commit.
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are still in flight (their
// data is then visible to this thread; __syncwarp / __syncthreads make it visible to others).
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace turbokv::cuda::paged
