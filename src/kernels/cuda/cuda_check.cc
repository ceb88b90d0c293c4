// CUDA error reporting and device discovery.
#include "kernels/cuda/cuda_check.h"

#include <cstdlib>
#include <string>

#include "kernels/cuda/launch.h"

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

bool programmatic_launch_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("TURBOKV_PDL");
    return env == nullptr || std::string(env) != "0";
  }();
  return enabled;
}

}  // namespace turbokv::cuda
