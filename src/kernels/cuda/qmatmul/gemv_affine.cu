// The GEMV instantiations of MLX affine weights (gemv.cuh): 2, 4, 8 bits x 4 row counts.
#include "core/error.h"
#include "kernels/cuda/qmatmul/gemv.cuh"

namespace turbokv::cuda::qmm {

void launch_gemv_affine(Kind kind, const GemvArgs& args, cudaStream_t stream) {
  switch (kind) {
    case Kind::kAffine2:
      return run_gemv_any_m<FormatAffine<2>>(args, stream);
    case Kind::kAffine4:
      return run_gemv_any_m<FormatAffine<4>>(args, stream);
    case Kind::kAffine8:
      return run_gemv_any_m<FormatAffine<8>>(args, stream);
    default:
      throw InvalidArgument(str_cat("launch_gemv_affine: kind ", int(kind), " is not MLX affine"));
  }
}

}  // namespace turbokv::cuda::qmm
