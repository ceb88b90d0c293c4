// CUDA error reporting and device discovery.
#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw Error(str_cat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ",
                      what, " at ", file, ":", line));
}

bool device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

int sm_count() {
  int device = 0;
  TURBOKV_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  TURBOKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace turbokv::cuda
