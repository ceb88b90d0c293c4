// Sink pass of TurboQuant paged attention: one block per (sequence, query, head) row attends the
// row's visible fp16 sink rows (TQSequenceState::sink_keys / sink_values; causal and sliding
// window as the coded part, scale and soft-cap the same), then merges that softmax with the
// coded part's row by their log-sum-exp: out = (w_c out_c + w_s out_s) / (w_c + w_s),
// w = exp(lse - max). Keys go in chunks of kSinkThreads (one score per thread) with an online
// softmax, so any number of sink tokens works. fp32 throughout.
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kvcache/launch.cuh"
#include "kernels/cuda/kvcache/plan.h"

namespace turbokv::cuda::paged {
namespace {

constexpr int kSinkThreads = 128;
constexpr int kSinkDims = kMaxHeadDim / kSinkThreads;  // output dims per thread

__global__ void __launch_bounds__(kSinkThreads) sink_merge_kernel(const SinkArgs a) {
  __shared__ float qv[kMaxHeadDim];
  __shared__ float score[kSinkThreads];
  const int tid = threadIdx.x;
  const int b = blockIdx.y, qi = blockIdx.x / a.n_heads, head = blockIdx.x % a.n_heads;
  const int q_first = a.q_start[b];
  const int n_q = a.q_start[b + 1] - q_first;
  if (qi >= min(n_q, a.max_n_q)) return;
  const int len = min(a.seq_len[b], a.table_tokens);
  const int pos = len - n_q + qi;
  const int lo = a.window > 0 ? max(pos - a.window + 1, 0) : 0;
  const int hi = min(pos + 1, a.sink_tokens);
  const int dim = a.head_dim, kv_head = head / a.group;
  const size_t row = size_t(q_first + qi) * a.n_heads + head;
  const TQSequenceState state = a.states[b];
  const __half* keys = state.sink_keys + size_t(kv_head) * a.sink_tokens * dim;
  const __half* values = state.sink_values + size_t(kv_head) * a.sink_tokens * dim;
  for (int d = tid; d < dim; d += kSinkThreads) qv[d] = a.q[row * dim + d];
  __syncthreads();

  float m = -INFINITY, l = 0;  // the same in every thread
  float acc[kSinkDims];
#pragma unroll
  for (int e = 0; e < kSinkDims; ++e) acc[e] = 0;
  for (int c0 = lo; c0 < hi; c0 += kSinkThreads) {
    const int n = min(kSinkThreads, hi - c0);
    if (tid < n) {
      const __half* k = keys + size_t(c0 + tid) * dim;
      float dot = 0;
      for (int d = 0; d < dim; ++d) dot += qv[d] * __half2float(k[d]);
      float z = dot * a.scale;
      if (a.softcap > 0) z = a.softcap * tanhf(z / a.softcap);
      score[tid] = z;
    }
    __syncthreads();
    float cmax = -INFINITY;
    for (int t = 0; t < n; ++t) cmax = fmaxf(cmax, score[t]);
    const float m_new = fmaxf(m, cmax);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    l *= alpha;
#pragma unroll
    for (int e = 0; e < kSinkDims; ++e) acc[e] *= alpha;
    for (int t = 0; t < n; ++t) {
      const float p = expf(score[t] - m_new);
      l += p;
      const __half* v = values + size_t(c0 + t) * dim;
#pragma unroll
      for (int e = 0; e < kSinkDims; ++e) {
        const int d = tid + kSinkThreads * e;
        if (d < dim) acc[e] += p * __half2float(v[d]);
      }
    }
    m = m_new;
    __syncthreads();  // score is refilled
  }
  if (!(l > 0)) return;  // no sink key visible: the coded row and its lse stand
  const float lse_s = m + logf(l);
  const float lse_c = a.lse[row];
  const float top = fmaxf(lse_c, lse_s);
  const float wc = lse_c == -INFINITY ? 0.0f : expf(lse_c - top);
  const float ws = expf(lse_s - top);
  const float inv = 1.0f / (wc + ws);
  float* out = a.out + row * dim;
#pragma unroll
  for (int e = 0; e < kSinkDims; ++e) {
    const int d = tid + kSinkThreads * e;
    if (d < dim) out[d] = (wc * out[d] + ws * (acc[e] / l)) * inv;
  }
  __syncthreads();  // every thread has read lse_c
  if (tid == 0) a.lse[row] = top + logf(wc + ws);
}

}  // namespace

void launch_sink_merge(const SinkArgs& s, int batch, cudaStream_t stream) {
  const dim3 grid(unsigned(s.max_n_q) * unsigned(s.n_heads), unsigned(batch));
  launch_kernel(sink_merge_kernel, grid, dim3(kSinkThreads), 0, stream, s);
}

}  // namespace turbokv::cuda::paged
