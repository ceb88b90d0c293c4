// Merge step of split-K attention, done inside the attention kernel (no second launch): every
// split writes its partial (state.cuh's write_block_partial, self-validating words), and the
// block of split 0 of a row group merges them: one warp per query row polls the splits'
// partials until every word is written, adds them with log-sum-exp weights, divides by
// the softmax sum and, for TurboQuant, takes the row back from the values' rotated frame with
// one inverse Hadamard rotation (state.cuh's hadamard_row). It then zeroes what it read, so the
// workspace is all zero again for the next call.
//
// Why split 0 polls the data: the data is its own "ready" flag (kPartialKey), so a split's
// partial reaches the merger with no fence, flag or counter round trip after it (measured
// faster; docs/kernels.md, "CUDA attention"). Waiting needs the other splits to
// run while split 0 waits: with 2 or more splits launch.cc plans at most as many blocks as the
// whole device holds at once, a merger (one per row group) waits only for blocks of its own
// row group, and those never wait, so any block that is not yet resident gets an SM as soon as
// one of them exits. Only a device share smaller than that (e.g. an MPS or green-context slice
// of very few SMs, all taken by waiting mergers) could stall it.
#pragma once

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/state.cuh"

namespace turbokv::cuda::attn {

__device__ __forceinline__ bool written(uint4 x) {
  return x.x != 0 && x.y != 0 && x.z != 0 && x.w != 0;
}
__device__ __forceinline__ bool written(uint2 x) { return x.x != 0 && x.y != 0; }

__device__ __forceinline__ void merge_row(const AttentionArgs& a, int b, int kv_head, int row,
                                          int n_splits, int lane, float out_scale) {
  const size_t base = ((size_t(b) * a.kv_heads + kv_head) * a.rows + row) * a.splits;
  uint4* part = a.part_acc + base * (kHeadDim / 4) + lane;
  uint2* part_ml = a.part_ml + base;
  // Splits in chunks of kChunk: every lane loads the chunk's (m, l) pairs (broadcast) and its
  // own 4 dims of each accumulator, all in one round trip, then again those not written yet,
  // and merges them without shuffles.
  constexpr int kChunk = 16;
  const uint32_t zero = encode_partial(0.0f);
  float m = -INFINITY, l = 0;
  float4 acc = make_float4(0, 0, 0, 0);
  for (int s0 = 0; s0 < n_splits; s0 += kChunk) {
    uint2 ml[kChunk];
    uint4 x[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {  // splits past n_splits: m = -inf, l = 0, acc = 0
      const bool in = s0 + i < n_splits;
      ml[i] = in ? make_uint2(0, 0) : make_uint2(encode_partial(-INFINITY), zero);
      x[i] = in ? make_uint4(0, 0, 0, 0) : make_uint4(zero, zero, zero, zero);
    }
    bool have_all;
    do {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        if (!written(ml[i])) ml[i] = load_relaxed(part_ml + s0 + i);
        if (!written(x[i])) x[i] = load_relaxed(part + (s0 + i) * (kHeadDim / 4));
      }
      have_all = true;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) have_all = have_all && written(ml[i]) && written(x[i]);
    } while (!__all_sync(0xffffffffu, have_all));
    float mi[kChunk];
    float m_new = m;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      mi[i] = decode_partial(ml[i].x);
      m_new = fmaxf(m_new, mi[i]);
    }
    if (m_new == -INFINITY) continue;          // no token in any split so far
    const float alpha = fast_exp2(m - m_new);  // 0 while m is -inf
    l *= alpha;
    acc.x *= alpha, acc.y *= alpha, acc.z *= alpha, acc.w *= alpha;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const float w = fast_exp2(mi[i] - m_new);  // 0 for empty and missing splits (-inf)
      l += decode_partial(ml[i].y) * w;
      acc.x += decode_partial(x[i].x) * w, acc.y += decode_partial(x[i].y) * w;
      acc.z += decode_partial(x[i].z) * w, acc.w += decode_partial(x[i].w) * w;
    }
    m = m_new;
  }
  stamp(a, kStampPublished);  // warp 0: its row's partials are all in
  const float inv = l > 0 ? out_scale / l : 0.0f;
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
  // Back to zero for the next call (every lane has read the (m, l) pairs: the votes and
  // shuffles above come after its loads).
  for (int s = 0; s < n_splits; ++s) {
    store_relaxed(part + s * (kHeadDim / 4), make_uint4(0, 0, 0, 0));
  }
  for (int s = lane; s < n_splits; s += 32) store_relaxed(part_ml + s, make_uint2(0, 0));
}

// After write_block_partial: split 0's block merges its row group (warp w takes rows w,
// w + kNumWarps, ... of the group) once the other splits' partials are in; the others are done.
// out_scale multiplies the merged rows (undoes a scaling of the value operands).
template <int kNumWarps>
__device__ __forceinline__ void finish_row_group(const AttentionArgs& a, const BlockCoords& bc,
                                                 int warp, int lane, float out_scale = 1.0f) {
  if (bc.split != 0) {
    stamp(a, kStampPublished);
    return;
  }
  const int n_splits = (bc.n_tiles + a.tiles_per_split - 1) / a.tiles_per_split;
  for (int col = warp; col < kColumns; col += kNumWarps) {
    const int row = bc.row_group * kColumns + col;
    if (row < a.rows) merge_row(a, bc.b, bc.kv_head, row, n_splits, lane, out_scale);
  }
  stamp(a, kStampLast, 1);
  stamp(a, kStampMerged);
}

}  // namespace turbokv::cuda::attn
