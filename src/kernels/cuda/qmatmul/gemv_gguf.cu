// The GEMV instantiations of the GGUF block formats (gemv.cuh): 5 formats x 4 row counts.
#include "core/error.h"
#include "kernels/cuda/qmatmul/gemv.cuh"

namespace turbokv::cuda::qmm {

void launch_gemv_gguf(Kind kind, const GemvArgs& args, cudaStream_t stream) {
  switch (kind) {
    case Kind::kQ8_0:
      return run_gemv_any_m<FormatQ8_0>(args, stream);
    case Kind::kQ4_0:
      return run_gemv_any_m<FormatQ4_0>(args, stream);
    case Kind::kQ5_0:
      return run_gemv_any_m<FormatQ5_0>(args, stream);
    case Kind::kQ4_K:
      return run_gemv_any_m<FormatQ4_K>(args, stream);
    case Kind::kQ6_K:
      return run_gemv_any_m<FormatQ6_K>(args, stream);
    default:
      throw InvalidArgument(str_cat("launch_gemv_gguf: kind ", int(kind), " is not a GGUF format"));
  }
}

}  // namespace turbokv::cuda::qmm
