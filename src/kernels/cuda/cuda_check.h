// CUDA error checks (file:line in the message) and the question "is there a usable GPU?".
// A failed CUDA call is an environment / runtime error: it throws turbokv::Error.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace turbokv::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

// True when the CUDA runtime finds at least one device it can use (false on a machine
// without a GPU or driver; never throws).
bool device_available();

// Streaming multiprocessors of the current device.
int sm_count();

}  // namespace turbokv::cuda

#define TURBOKV_CUDA_CHECK(expr)                                                   \
  do {                                                                             \
    const cudaError_t tkv_cuda_err_ = (expr);                                      \
    if (tkv_cuda_err_ != cudaSuccess)                                              \
      ::turbokv::cuda::throw_cuda_error(tkv_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports bad launch configurations at the call site.
#define TURBOKV_CUDA_CHECK_LAUNCH() TURBOKV_CUDA_CHECK(cudaGetLastError())
