// Merge step of split-K attention, done by the last block of a row group to finish (no
// second launch): one warp per query row adds the splits' partials with log-sum-exp weights,
// divides by the softmax sum and, for TurboQuant, takes the row back from the values'
// rotated frame with one inverse Hadamard rotation (lane l holds dims 4l .. 4l+3:
// butterflies h = 1, 2 in the lane, h >= 4 across lanes). No block barriers.
#pragma once

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/state.cuh"

namespace turbokv::cuda::attn {

__device__ __forceinline__ void merge_row(const AttentionArgs& a, int b, int kv_head, int row,
                                          int n_splits, int lane) {
  const size_t base = ((size_t(b) * a.kv_heads + kv_head) * a.rows + row) * a.splits;
  const float4* part = reinterpret_cast<const float4*>(a.part_acc + base * kHeadDim) + lane;
  // The first kEarly splits' accumulators are loaded together with the (m, l) values: one
  // round trip to L2 instead of two. Lane l holds the (m, l) of splits l, l + 32, ...
  constexpr int kEarly = 16;
  float4 early[kEarly];
#pragma unroll
  for (int i = 0; i < kEarly; ++i) {
    early[i] = i < n_splits ? __ldcg(part + i * (kHeadDim / 4)) : make_float4(0, 0, 0, 0);
  }
  constexpr int kRounds = kMaxSplits / 32;
  float2 ml[kRounds];
  float m = -INFINITY;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int s = 32 * r + lane;
    ml[r] = s < n_splits ? __ldcg(&a.part_ml[base + s]) : make_float2(-INFINITY, 0.0f);
    m = fmaxf(m, ml[r].x);
  }
  for (int k = 16; k > 0; k /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
  float l = 0;
  float4 acc = make_float4(0, 0, 0, 0);
  if (m != -INFINITY) {
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      if (32 * r >= n_splits) break;
      const float my_weight = fast_exp2(ml[r].x - m);  // 0 for missing splits (-inf)
      l += ml[r].y * my_weight;
      if (r == 0) {
#pragma unroll
        for (int i = 0; i < kEarly; ++i) {
          const float w = __shfl_sync(0xffffffffu, my_weight, i);  // 0 past n_splits
          acc.x += early[i].x * w, acc.y += early[i].y * w;
          acc.z += early[i].z * w, acc.w += early[i].w * w;
        }
      }
      const int begin = r == 0 ? kEarly : 0;
      const int count = min(32, n_splits - 32 * r);
#pragma unroll 8
      for (int i = begin; i < count; ++i) {
        const float w = __shfl_sync(0xffffffffu, my_weight, i);
        const float4 x = __ldcg(part + (32 * r + i) * (kHeadDim / 4));
        acc.x += x.x * w, acc.y += x.y * w, acc.z += x.z * w, acc.w += x.w * w;
      }
    }
  }
  for (int k = 16; k > 0; k /= 2) l += __shfl_xor_sync(0xffffffffu, l, k);
  const float inv = l > 0 ? 1.0f / l : 0.0f;
  float o[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
  if (a.unrotate) {  // R^T y = s ⊙ (H y) * scale
    for (int h = 1; h <= 2; h *= 2) {
      for (int j = 0; j < 4; ++j) {
        if (j & h) continue;
        const float x = o[j], y = o[j + h];
        o[j] = x + y;
        o[j + h] = x - y;
      }
    }
    for (int h = 4; h < kHeadDim; h *= 2) {
      const bool upper = lane & (h / 4);
      for (int j = 0; j < 4; ++j) {
        const float other = __shfl_xor_sync(0xffffffffu, o[j], h / 4);
        o[j] = upper ? other - o[j] : o[j] + other;
      }
    }
    // Dims 4l .. 4l+3 sit in flip word l / 8 (constant indices keep the args out of memory).
    const uint32_t* f = a.value_sign_flips;
    const uint32_t flips = lane < 8 ? f[0] : lane < 16 ? f[1] : lane < 24 ? f[2] : f[3];
    for (int j = 0; j < 4; ++j) {
      o[j] *= a.hadamard_scale;
      if ((flips >> ((4 * lane + j) % 32)) & 1u) o[j] = -o[j];
    }
  }
  const int qi = row / a.group;
  const int head = kv_head * a.group + row % a.group;
  reinterpret_cast<float4*>(a.out + ((size_t(b) * a.n_q + qi) * a.n_heads + head) *
                                        kHeadDim)[lane] = make_float4(o[0], o[1], o[2], o[3]);
}

// After write_block_partial: counts this block in; the last block of the row group merges
// its rows (warp w takes rows w, w + kNumWarps, ... of the group).
template <int kNumWarps>
__device__ __forceinline__ void finish_row_group(const AttentionArgs& a, const BlockCoords& bc,
                                                 int warp, int lane) {
  __shared__ int is_last;
  const int n_splits = (bc.n_tiles + a.tiles_per_split - 1) / a.tiles_per_split;
  __threadfence();  // this block's partials are visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter =
        a.counters + (size_t(bc.b) * a.kv_heads + bc.kv_head) * a.row_groups + bc.row_group;
    is_last = atomicAdd(counter, 1) == n_splits - 1;
    if (is_last) *counter = 0;  // ready for the next call
  }
  __syncthreads();
  stamp(a, kStampCounted);
  stamp(a, kStampLast, is_last);
  if (!is_last) return;
  __threadfence();
  for (int col = warp; col < kColumns; col += kNumWarps) {
    const int row = bc.row_group * kColumns + col;
    if (row < a.rows) merge_row(a, bc.b, bc.kv_head, row, n_splits, lane);
  }
  if (a.timeline != nullptr) {
    __syncthreads();
    stamp(a, kStampMerged);
  }
}

}  // namespace turbokv::cuda::attn
