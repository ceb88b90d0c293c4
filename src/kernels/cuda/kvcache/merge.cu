// Merge pass of paged attention: one block per (sequence, query, head) row combines the splits'
// partials with log-sum-exp weights, divides by the softmax sum and, for TurboQuant, takes the
// row back from the values' rotated frame (one inverse rotation per segment) and adds the
// value mean; optionally writes the row's log-sum-exp. A row that saw no key is written as
// zeros (log-sum-exp -inf).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kvcache/frame.cuh"
#include "kernels/cuda/kvcache/launch.cuh"
#include "kernels/cuda/kvcache/plan.h"

namespace turbokv::cuda::paged {
namespace {

constexpr int kMergeThreads = 128;

__global__ void __launch_bounds__(kMergeThreads)
    paged_merge_kernel(const MergeArgs a, const TQFormat f, int unrotate) {
  __shared__ float weight[kMaxSplits];
  __shared__ float y[kMaxHeadDim], x[kMaxHeadDim], work[kMaxHeadDim];
  const int tid = threadIdx.x;
  const int b = blockIdx.y, qi = blockIdx.x / a.n_heads, head = blockIdx.x % a.n_heads;
  const int q_first = a.q_start[b];
  const int n_q = a.q_start[b + 1] - q_first;
  if (qi >= min(n_q, a.max_n_q)) return;
  const int len = min(a.seq_len[b], a.table_tokens);
  const int n_splits = len > 0 ? min(a.splits, (len + a.split_tokens - 1) / a.split_tokens) : 0;
  const size_t first = ((size_t(b) * a.max_n_q + qi) * a.n_heads + head) * a.splits;
  const int dim = a.head_dim;

  float m = -INFINITY;  // every thread reads the same values in the same order
  for (int s = 0; s < n_splits; ++s) m = fmaxf(m, a.part_ml[first + s].x);
  for (int s = tid; s < n_splits; s += blockDim.x) {
    weight[s] = m == -INFINITY ? 0.0f : exp2f(a.part_ml[first + s].x - m);
  }
  __syncthreads();
  float l = 0;
  for (int s = 0; s < n_splits; ++s) l += weight[s] * a.part_ml[first + s].y;
  const bool seen = l > 0;
  const float inv = seen ? 1.0f / l : 0.0f;
  if (a.lse != nullptr && tid == 0) {
    a.lse[size_t(q_first + qi) * a.n_heads + head] =
        seen ? (m + log2f(l)) * 0.6931471805599453f : -INFINITY;
  }
  for (int d = tid; d < dim; d += blockDim.x) {
    float acc = 0;
    for (int s = 0; s < n_splits; ++s) acc += weight[s] * a.part_acc[(first + s) * dim + d];
    y[d] = acc * inv;
  }
  __syncthreads();
  const int kv_head = head / a.group;
  const TQSequenceState state = unrotate && a.states != nullptr ? a.states[b] : TQSequenceState{};
  const float* row = y;
  if (unrotate && seen) {
    unrotate_row(f.value, state.value_order, kv_head, dim, y, x, work);
    row = x;
  }
  const __half* mean = seen ? state.value_mean : nullptr;
  float* out = a.out + (size_t(q_first + qi) * a.n_heads + head) * dim;
  for (int d = tid; d < dim; d += blockDim.x) {
    out[d] = mean != nullptr ? row[d] + __half2float(mean[kv_head * dim + d]) : row[d];
  }
}

}  // namespace

void launch_merge(const MergeArgs& m, const TQFormat* value, int batch, cudaStream_t stream) {
  const dim3 grid(unsigned(m.max_n_q) * unsigned(m.n_heads),
                  unsigned(batch));  // plan_splits checked
  launch_kernel(paged_merge_kernel, grid, dim3(kMergeThreads), 0, stream, m,
                value != nullptr ? *value : TQFormat{}, value != nullptr ? 1 : 0);
}

}  // namespace turbokv::cuda::paged
