// Sink pass of TurboQuant paged attention: one block per (sequence, query, head) row attends the
// row's visible fp16 sink rows (TQSequenceState::sink_keys / sink_values; causal and sliding
// window as the coded part, scale and soft-cap the same) and, with recent tokens (W), its
// window of positions max(sink_tokens, p - W + 1) .. p as fp16 rows (the step's own keys and
// values from k_new / v_new rounded like core/half.h, earlier positions from the sequence's
// ring), then merges that softmax with the coded part's row by their log-sum-exp:
// out = (w_c out_c + w_s out_s) / (w_c + w_s), w = exp(lse - max). Keys go in chunks of
// kSinkThreads (one score per thread) with an online softmax, so any number of sink tokens
// works. fp32 throughout. The ring update kernel (paged_recent_update) follows the attention.
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/codec_ops.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kvcache/launch.cuh"
#include "kernels/cuda/kvcache/plan.h"

namespace turbokv::cuda::paged {
namespace {

constexpr int kSinkThreads = 128;
constexpr int kSinkDims = kMaxHeadDim / kSinkThreads;  // output dims per thread

// Element d of the key (role 0) or value (role 1) at position t of the row's sink or recent
// rows. chunk_first: the position of the sequence's first query (its k_new / v_new row
// q_first).
__device__ __forceinline__ float dense_element(const SinkArgs& a, const TQSequenceState& state,
                                               int role, int kv_head, int t, int chunk_first,
                                               int q_first, int d) {
  const int dim = a.head_dim;
  if (t < a.sink_tokens) {
    const __half* rows = role == 0 ? state.sink_keys : state.sink_values;
    return __half2float(rows[(size_t(kv_head) * a.sink_tokens + t) * dim + d]);
  }
  if (t >= chunk_first) {
    const float* rows = role == 0 ? a.k_new : a.v_new;
    const float x = rows[(size_t(q_first + t - chunk_first) * a.kv_heads + kv_head) * dim + d];
    return __half2float(__ushort_as_half(to_f16_bits(x)));
  }
  const int ring = a.recent_tokens - 1;
  const __half* rows = role == 0 ? state.recent_keys : state.recent_values;
  return __half2float(rows[(size_t(kv_head) * ring + t % ring) * dim + d]);
}

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
  // Sink positions [lo, sink_hi), then recent positions [recent_lo, pos + 1): n in all.
  const int sink_hi = max(min(pos + 1, a.sink_tokens), lo);
  const int recent_lo =
      a.recent_tokens > 0 ? max(max(lo, a.sink_tokens), pos - a.recent_tokens + 1) : pos + 1;
  const int n_sink = sink_hi - lo;
  const int n_all = n_sink + max(pos + 1 - recent_lo, 0);
  const int dim = a.head_dim, kv_head = head / a.group;
  const int chunk_first = len - n_q;
  const size_t row = size_t(q_first + qi) * a.n_heads + head;
  const TQSequenceState state = a.states[b];
  for (int d = tid; d < dim; d += kSinkThreads) qv[d] = a.q[row * dim + d];
  __syncthreads();

  float m = -INFINITY, l = 0;  // the same in every thread
  float acc[kSinkDims];
#pragma unroll
  for (int e = 0; e < kSinkDims; ++e) acc[e] = 0;
  for (int c0 = 0; c0 < n_all; c0 += kSinkThreads) {
    const int n = min(kSinkThreads, n_all - c0);
    if (tid < n) {
      const int j = c0 + tid;
      const int t = j < n_sink ? lo + j : recent_lo + (j - n_sink);
      float dot = 0;
      for (int d = 0; d < dim; ++d) {
        dot += qv[d] * dense_element(a, state, 0, kv_head, t, chunk_first, q_first, d);
      }
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
    for (int i = 0; i < n; ++i) {
      const float p = expf(score[i] - m_new);
      l += p;
      const int j = c0 + i;
      const int t = j < n_sink ? lo + j : recent_lo + (j - n_sink);
#pragma unroll
      for (int e = 0; e < kSinkDims; ++e) {
        const int d = tid + kSinkThreads * e;
        if (d < dim) acc[e] += p * dense_element(a, state, 1, kv_head, t, chunk_first, q_first, d);
      }
    }
    m = m_new;
    __syncthreads();  // score is refilled
  }
  if (!(l > 0)) return;  // no sink or recent key visible: the coded row and its lse stand
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

// One block per (sequence, one of its last min(n_q, W - 1) positions): keys and values of that
// position from k_new / v_new into the ring slot position % (W - 1), fp16 (core/half.h).
__global__ void __launch_bounds__(kSinkThreads) recent_update_kernel(const RecentArgs a) {
  const int b = blockIdx.y;
  const int q_first = a.q_start[b];
  const int n_q = min(a.q_start[b + 1] - q_first, a.max_n_q);
  const int ring = a.recent_tokens - 1;
  const int kept = min(n_q, ring);
  if (int(blockIdx.x) >= kept) return;
  const int len = min(a.seq_len[b], a.table_tokens);
  const int i = n_q - kept + int(blockIdx.x);  // the query row
  const int pos = len - n_q + i;
  if (pos < a.sink_tokens || pos < 0) return;
  const TQSequenceState state = a.states[b];
  const int dim = a.head_dim, slot = pos % ring;
  for (int e = threadIdx.x; e < 2 * a.kv_heads * dim; e += blockDim.x) {
    const int role = e / (a.kv_heads * dim), h = (e / dim) % a.kv_heads, d = e % dim;
    const float x =
        (role == 0 ? a.k_new : a.v_new)[(size_t(q_first + i) * a.kv_heads + h) * dim + d];
    __half* dst = role == 0 ? state.recent_keys : state.recent_values;
    dst[(size_t(h) * ring + slot) * dim + d] = __ushort_as_half(to_f16_bits(x));
  }
}

}  // namespace

void launch_recent_update(const RecentArgs& r, int batch, cudaStream_t stream) {
  const dim3 grid(unsigned(std::min(r.max_n_q, r.recent_tokens - 1)), unsigned(batch));
  launch_kernel(recent_update_kernel, grid, dim3(kSinkThreads), 0, stream, r);
}

void launch_sink_merge(const SinkArgs& s, int batch, cudaStream_t stream) {
  const dim3 grid(unsigned(s.max_n_q) * unsigned(s.n_heads), unsigned(batch));
  launch_kernel(sink_merge_kernel, grid, dim3(kSinkThreads), 0, stream, s);
}

}  // namespace turbokv::cuda::paged
