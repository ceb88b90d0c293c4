// Owning device allocation (cudaMalloc / cudaFree), move-only. Costly operations have names
// that say so: upload(), download(), zero(). Each is complete when it returns, so work queued
// afterwards on any stream, non-blocking ones included, sees the data: cudaMemset and a
// pageable cudaMemcpy to the device may still be running on the legacy stream at return.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0) TURBOKV_CUDA_CHECK(cudaMalloc(&data_, count * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  static DeviceBuffer upload(const std::vector<T>& host) {
    DeviceBuffer buffer(host.size());
    if (!host.empty()) {
      TURBOKV_CUDA_CHECK(
          cudaMemcpy(buffer.data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
    return buffer;
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ > 0) {
      TURBOKV_CUDA_CHECK(
          cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return host;
  }
  void zero() {
    if (count_ == 0) return;
    TURBOKV_CUDA_CHECK(cudaMemset(data_, 0, count_ * sizeof(T)));
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace turbokv::cuda
