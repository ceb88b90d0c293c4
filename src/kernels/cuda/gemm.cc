// Gemm (gemm.h): one cuBLAS handle bound to the engine's stream, with its own workspace so
// that the calls can be captured in CUDA graphs.
#include "kernels/cuda/gemm.h"

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"

namespace turbokv::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(str_cat("cuBLAS ", what, " failed: ", cublasGetStatusString(status)));
  }
}

cudaDataType_t data_type(Elem e) {
  switch (e) {
    case Elem::kF32: return CUDA_R_32F;
    case Elem::kF16: return CUDA_R_16F;
    case Elem::kBF16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

}  // namespace

Gemm::Gemm(cudaStream_t stream) : stream_(stream) {
  const char* env = std::getenv("TURBOKV_GEMV");
  use_gemv_ = env == nullptr || std::string(env) != "0";
  check(cublasCreate(&handle_), "cublasCreate");
  check(cublasSetStream(handle_, stream), "cublasSetStream");
  TURBOKV_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  check(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes), "cublasSetWorkspace");
}

Gemm::~Gemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

void Gemm::run(const void* x, const void* w, Elem elem, int64_t m, int64_t n, int64_t k,
               float* y, int64_t ldy, bool accumulate) const {
  if (m == 0 || n == 0) return;
  if (m < 0 || n < 0 || k < 1 || ldy < n || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    throw InvalidArgument(str_cat("gemm: m ", m, ", n ", n, ", k ", k, ", ldy ", ldy));
  }
  if (use_gemv_ && gemv_supported(x, w, elem, m, k)) {
    gemv(x, w, elem, m, n, k, y, ldy, accumulate, stream_);
    return;
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // Column-major view: yᵀ [n, m] = W [n, k] (stored as Wᵀ [k, n]) · xᵀ [k, m].
  check(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, w,
                     data_type(elem), int(k), x, data_type(elem), int(k), &beta, y, CUDA_R_32F,
                     int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

}  // namespace turbokv::cuda
