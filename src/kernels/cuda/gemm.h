// y = x · Wᵀ through cuBLAS (torch.nn.Linear's layout, W [out, in] row-major), with fp32
// accumulation and an fp32 result; x is in W's element type (the caller narrows it).
// fp32 weights run in full fp32 (CUBLAS_COMPUTE_32F with the default math mode: no TF32), so
// the GPU matches the CPU engine closely; bf16 and fp16 weights run on the tensor cores, and
// with at most kGemvMaxRows rows of x on our GEMV (gemv.h), which streams the weights at close
// to memory speed (TURBOKV_GEMV=0 in the environment: cuBLAS for every shape, to compare).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/model_ops.h"

namespace turbokv::cuda {

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y [m, n] (row stride ldy >= n) = x [m, k] · w [n, k]ᵀ (+ y when accumulate). w and x are of
  // elem; y fp32.
  void run(const void* x, const void* w, Elem elem, int64_t m, int64_t n, int64_t k, float* y,
           int64_t ldy, bool accumulate = false) const;
  cublasHandle_t handle() const { return handle_; }  // bound to the stream
  // Whether run() takes small-m products to gemv (TURBOKV_GEMV unset or not "0").
  bool uses_gemv() const { return use_gemv_; }

 private:
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool use_gemv_ = true;
};

}  // namespace turbokv::cuda
