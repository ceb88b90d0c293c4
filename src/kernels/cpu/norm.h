// RMSNorm over the rows of a matrix: out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight.
// Gemma's (1 + w) form is a weight the model prepares once; it is the same kernel.
//   rms_norm     : fast path (AVX2 when available)
//   rms_norm_ref : scalar reference, double accumulation
#pragma once

#include <cstdint>

namespace turbokv {

// x, out: [rows, dim]; weight: [dim]. out may alias x.
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps,
              float* out);
void rms_norm_ref(const float* x, int64_t rows, int64_t dim, const float* weight, float eps,
                  float* out);

}  // namespace turbokv
