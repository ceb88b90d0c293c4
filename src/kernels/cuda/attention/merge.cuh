// Merge step of split-K attention, done inside the attention kernel (no second launch): the
// block of split 0 of a row group waits until every other split has published its partial
// (one flag per split), then one warp per query row adds the splits' partials with
// log-sum-exp weights, divides by the softmax sum and, for TurboQuant, takes the row back from
// the values' rotated frame with one inverse Hadamard rotation (state.cuh's hadamard_row).
//
// Why split 0 waits instead of the last block to finish merging: the last block then only
// publishes its partial to a merger that is already waiting, with no counter atomic to
// round-trip first (measured: bench/results/2026-11-30-h200-attention-fixed-costs.txt).
// Waiting needs the other splits to run while split 0 waits: with 2 or more splits launch.cc
// plans at most as many blocks as the whole device holds at once, a merger (one per row
// group) waits only for blocks of its own row group, and those never wait, so any block that
// is not yet resident gets an SM as soon as one of them exits. Only a device share smaller
// than that (e.g. an MPS or green-context slice of very few SMs, all taken by waiting
// mergers) could stall it; the counter-based merge before commit 788fed8 had no such limit.
#pragma once

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/state.cuh"

namespace turbokv::cuda::attn {

__device__ __forceinline__ void merge_row(const AttentionArgs& a, int b, int kv_head, int row,
                                          int n_splits, int lane) {
  const size_t base = ((size_t(b) * a.kv_heads + kv_head) * a.rows + row) * a.splits;
  const float4* part = reinterpret_cast<const float4*>(a.part_acc + base * kHeadDim) + lane;
  // Splits in chunks of kChunk: every lane loads the chunk's (m, l) pairs (broadcast) and its
  // own 4 dims of each accumulator, all in one round trip, and merges them without shuffles.
  constexpr int kChunk = 16;
  float m = -INFINITY, l = 0;
  float4 acc = make_float4(0, 0, 0, 0);
  for (int s0 = 0; s0 < n_splits; s0 += kChunk) {
    float2 ml[kChunk];
    float4 x[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const bool in = s0 + i < n_splits;
      ml[i] = in ? __ldcg(&a.part_ml[base + s0 + i]) : make_float2(-INFINITY, 0.0f);
      x[i] = in ? __ldcg(part + (s0 + i) * (kHeadDim / 4)) : make_float4(0, 0, 0, 0);
    }
    float m_new = m;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) m_new = fmaxf(m_new, ml[i].x);
    if (m_new == -INFINITY) continue;          // no token in any split so far
    const float alpha = fast_exp2(m - m_new);  // 0 while m is -inf
    l *= alpha;
    acc.x *= alpha, acc.y *= alpha, acc.z *= alpha, acc.w *= alpha;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const float w = fast_exp2(ml[i].x - m_new);  // 0 for empty and missing splits (-inf)
      l += ml[i].y * w;
      acc.x += x[i].x * w, acc.y += x[i].y * w, acc.z += x[i].z * w, acc.w += x[i].w * w;
    }
    m = m_new;
  }
  const float inv = l > 0 ? 1.0f / l : 0.0f;
  float o[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
  if (a.unrotate) {  // R^T y = s ⊙ (H y) * scale
    hadamard_row(o, lane);
    const uint32_t* f = a.value_sign_flips;
    const uint32_t flips = lane_flip_word(make_uint4(f[0], f[1], f[2], f[3]), lane);
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

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Spins until splits 1 .. n_splits - 1 have published (lane l watches splits l + 1, l + 33, ...);
// after it, every lane of the warp may read their partials.
__device__ __forceinline__ void wait_for_splits(const int* flags, int n_splits, int lane) {
  for (int s = 1 + lane; s < n_splits; s += 32) {
    while (load_acquire(flags + s) == 0) {
    }
  }
  __syncwarp();  // orders the other lanes' reads after the acquires
}

// After write_block_partial: split s > 0 publishes its partial; split 0's block waits for the
// others, merges (warp w takes rows w, w + kNumWarps, ... of the group) and clears the flags
// for the next call.
template <int kNumWarps>
__device__ __forceinline__ void finish_row_group(const AttentionArgs& a, const BlockCoords& bc,
                                                 int warp, int lane) {
  const int n_splits = (bc.n_tiles + a.tiles_per_split - 1) / a.tiles_per_split;
  int* flags =
      a.flags + ((size_t(bc.b) * a.kv_heads + bc.kv_head) * a.row_groups + bc.row_group) * a.splits;
  __syncthreads();  // every thread's partial stores are issued
  if (bc.split != 0) {
    if (threadIdx.x == 0) {
      __threadfence();  // cumulative over the block's stores that the barrier ordered before it
      atomicExch(flags + bc.split, 1);
    }
    stamp(a, kStampPublished);
    return;
  }
  wait_for_splits(flags, n_splits, lane);
  stamp(a, kStampPublished);
  for (int col = warp; col < kColumns; col += kNumWarps) {
    const int row = bc.row_group * kColumns + col;
    if (row < a.rows) merge_row(a, bc.b, bc.kv_head, row, n_splits, lane);
  }
  __syncthreads();  // every warp is past its wait
  for (int s = 1 + threadIdx.x; s < n_splits; s += blockDim.x) flags[s] = 0;
  stamp(a, kStampLast, 1);
  stamp(a, kStampMerged);
}

}  // namespace turbokv::cuda::attn
