// Merge step of split-K attention: adds the splits' partials of one query row by
// log-sum-exp weights, divides by the softmax sum, and (TurboQuant) takes the result back
// from the values' rotated frame with one inverse Hadamard rotation.
#include "kernels/cuda/attention/kernels.h"
#include "kernels/cuda/attention/state.cuh"

namespace turbokv::cuda::attn {
namespace {

__global__ void __launch_bounds__(kHeadDim) merge_kernel(const MergeArgs a) {
  __shared__ float o[kHeadDim];
  const int d = threadIdx.x;
  const int row = blockIdx.x % a.rows;
  const int kv_head = (blockIdx.x / a.rows) % a.kv_heads;
  const int b = blockIdx.x / (a.rows * a.kv_heads);
  const int len = a.seq_lens[b];
  const int n_tiles = (len + kTileTokens - 1) / kTileTokens;
  const int n_splits = min(a.splits, (n_tiles + a.tiles_per_split - 1) / a.tiles_per_split);
  const size_t base = ((size_t(b) * a.kv_heads + kv_head) * a.rows + row) * a.splits;

  float m = -INFINITY;
  for (int s = 0; s < n_splits; ++s) m = fmaxf(m, a.part_ml[base + s].x);
  float acc = 0, l = 0;
  if (m != -INFINITY) {
    for (int s = 0; s < n_splits; ++s) {
      const float2 ml = a.part_ml[base + s];
      const float f = fast_exp2(ml.x - m);
      l += ml.y * f;
      acc += a.part_acc[(base + s) * kHeadDim + d] * f;
    }
  }
  float value = l > 0 ? acc / l : 0.0f;
  if (a.unrotate) {  // R^T y = s ⊙ (H y) * scale
    o[d] = value;
    for (int h = 1; h < kHeadDim; h *= 2) {
      __syncthreads();
      if (d < kHeadDim / 2) {
        const int lo = (d / h) * 2 * h + d % h;
        const float x = o[lo], y = o[lo + h];
        o[lo] = x + y;
        o[lo + h] = x - y;
      }
    }
    __syncthreads();
    value = o[d] * a.hadamard_scale;
    if ((a.value_sign_flips[d / 32] >> (d % 32)) & 1u) value = -value;
  }
  const int qi = row / a.group;
  const int head = kv_head * a.group + row % a.group;
  a.out[((size_t(b) * a.n_q + qi) * a.n_heads + head) * kHeadDim + d] = value;
}

}  // namespace

void launch_merge(const MergeArgs& args, int batch, cudaStream_t stream) {
  merge_kernel<<<batch * args.kv_heads * args.rows, kHeadDim, 0, stream>>>(args);
}

}  // namespace turbokv::cuda::attn
