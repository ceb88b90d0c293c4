// Kernels of hybrid_ops.h: grid-stride loops, one block per row where a row is reordered.
#include "kernels/cuda/hybrid_ops.h"

#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

#define TURBOKV_GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__global__ void copy_cols_kernel(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                                 int64_t rows, int64_t cols) {
  TURBOKV_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * dst_ld + c] = src[r * src_ld + c];
  }
}

__global__ void split_kernel(const float* qg, int64_t T, int heads, int hd, float* q, int64_t q_ld,
                             float* gate) {
  const int64_t width = int64_t(heads) * hd;
  TURBOKV_GRID_STRIDE(i, T * width) {
    const int64_t t = i / width, c = i % width, h = c / hd, e = c % hd;
    const float* src = qg + (t * heads + h) * 2 * hd;
    q[t * q_ld + c] = src[e];
    gate[i] = src[hd + e];
  }
}

__global__ void sigmoid_gate_kernel(float* x, const float* gate, int64_t n) {
  TURBOKV_GRID_STRIDE(i, n) { x[i] *= 1.0f / (1.0f + expf(-gate[i])); }
}

__global__ void gated_rows_kernel(float* out, const float* y, const float* gate, int64_t rows,
                                  int64_t dim) {
  TURBOKV_GRID_STRIDE(i, rows * dim) {
    const float s = 1.0f / (1.0f + expf(-gate[i / dim]));
    out[i] += s * y[i];
  }
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  TURBOKV_GRID_STRIDE(i, n) { x[i] *= s; }
}

__global__ void add_scale_kernel(float* x, const float* y, int64_t n, float s) {
  TURBOKV_GRID_STRIDE(i, n) { x[i] = (x[i] + y[i]) * s; }
}

__global__ void deinterleave_kernel(float* x, int64_t ld, int d) {
  extern __shared__ float row[];
  float* xr = x + int64_t(blockIdx.x) * ld;
  for (int i = threadIdx.x; i < d; i += blockDim.x) row[i] = xr[i];
  __syncthreads();
  for (int i = threadIdx.x; i < d / 2; i += blockDim.x) {
    xr[i] = row[2 * i];
    xr[d / 2 + i] = row[2 * i + 1];
  }
}

}  // namespace

void copy_cols(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
               int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  copy_cols_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(src, src_ld, dst, dst_ld, rows,
                                                                   cols);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void split_query_gate(const float* qg, int64_t T, int heads, int hd, float* q, int64_t q_ld,
                      float* gate, cudaStream_t stream) {
  if (T <= 0) return;
  split_kernel<<<grid_for(T * heads * hd), kThreads, 0, stream>>>(qg, T, heads, hd, q, q_ld, gate);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void sigmoid_gate(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  sigmoid_gate_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, gate, n);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void add_sigmoid_gated_rows(float* out, const float* y, const float* gate, int64_t rows,
                            int64_t dim, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  gated_rows_kernel<<<grid_for(rows * dim), kThreads, 0, stream>>>(out, y, gate, rows, dim);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void scale(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, s);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void add_scale(float* x, const float* y, int64_t n, float s, cudaStream_t stream) {
  if (n <= 0) return;
  add_scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n, s);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

void deinterleave_pairs(float* x, int64_t rows, int64_t ld, int d, cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  deinterleave_kernel<<<unsigned(rows), 64, size_t(d) * sizeof(float), stream>>>(x, ld, d);
  TURBOKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace turbokv::cuda
