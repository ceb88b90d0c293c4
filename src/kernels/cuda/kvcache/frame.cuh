// The rotated frame of a TurboQuant tensor format on the device: which channel a segment
// coordinate is, the query rotation of the attention prologue (one warp per row) and the
// inverse rotation of the merge (one block per row). Frame coordinate d of a vector is
// coordinate d - channel_offset of the segment that holds it (segment 0 first).
// The attention path needs no bit-exactness: plain float arithmetic.
#pragma once

#include "kernels/cuda/codec_ops.cuh"
#include "kernels/cuda/kvcache/paged.h"

namespace turbokv::cuda::paged {

// Channel of the vector that is coordinate i of segment `seg` of KV head kv_head: through the
// sequence's channel order (TQSequenceState::*_order, [kv_heads, head_dim]) or, without one,
// the natural order.
__device__ __forceinline__ int segment_channel(const TQSegment& seg, const int* order, int kv_head,
                                               int head_dim, int i) {
  return order != nullptr ? order[kv_head * head_dim + seg.channel_offset + i]
                          : seg.channel_offset + i;
}

// frame[(channel_offset + i) * 4 + r] = (R_s q_s)_i for every segment s: the query row q
// (nullptr: zeros) of KV head kv_head in the codec frame, as component r of a float4 row
// array. order: the sequence's channel order (nullable). scratch: this warp's [kMaxHeadDim]
// shared floats. Warp-collective.
__device__ __forceinline__ void rotate_query_row(const TQTensorFormat& t, const int* order,
                                                 const float* q, int kv_head, int head_dim, int r,
                                                 float* frame, float* scratch, int lane) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {  // constant segment index: no dynamic param indexing
    if (s >= t.segments) break;
    const TQSegment& seg = t.seg[s];
    const int n = seg.dim, first = seg.channel_offset;
    for (int i = lane; i < n; i += 32) {
      const float x = q != nullptr ? q[segment_channel(seg, order, kv_head, head_dim, i)] : 0.0f;
      scratch[i] = seg.hadamard && sign_flip_at(seg.sign_words, i) ? -x : x;
    }
    __syncwarp();
    if (seg.hadamard) {
      fwht_warp(scratch, n, lane);
      for (int i = lane; i < n; i += 32) {
        frame[(first + i) * 4 + r] = scratch[i] * seg.hadamard_scale;
      }
    } else {
      for (int i = lane; i < n; i += 32) {
        float acc = 0;  // (R u)_i = Σ_j R^T[j][i] u_j: lanes read consecutive i
        for (int j = 0; j < n; ++j) acc += seg.rotation_t[j * n + i] * scratch[j];
        frame[(first + i) * 4 + r] = acc;
      }
    }
    __syncwarp();  // scratch is free for the next segment
  }
}

// x[channel] = (R_s^T y_s)_i for every segment: an output row y [head_dim] in the codec frame
// back in the natural frame. order: the sequence's channel order (nullable). work:
// [kMaxHeadDim] shared floats. Block-collective; y must be __syncthreads()ed before, x is
// after.
__device__ __forceinline__ void unrotate_row(const TQTensorFormat& t, const int* order, int kv_head,
                                             int head_dim, const float* y, float* x, float* work) {
  const int tid = threadIdx.x, threads = blockDim.x;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    if (s >= t.segments) break;
    const TQSegment& seg = t.seg[s];
    const int n = seg.dim, first = seg.channel_offset;
    if (seg.hadamard) {  // R^T y = s ⊙ (H y) * scale
      for (int i = tid; i < n; i += threads) work[i] = y[first + i];
      __syncthreads();
      for (int h = 1; h < n; h *= 2) {
        for (int p = tid; p < n / 2; p += threads) {
          const int j = (p / h) * 2 * h + p % h;
          const float u = work[j], v = work[j + h];
          work[j] = u + v;
          work[j + h] = u - v;
        }
        __syncthreads();
      }
      for (int i = tid; i < n; i += threads) {
        const float v = work[i] * seg.hadamard_scale;
        x[segment_channel(seg, order, kv_head, head_dim, i)] =
            sign_flip_at(seg.sign_words, i) ? -v : v;
      }
    } else {
      for (int j = tid; j < n; j += threads) {
        float acc = 0;  // (R^T y)_j = Σ_i R[i][j] y_i: threads read consecutive j
        for (int i = 0; i < n; ++i) acc += seg.rotation[i * n + j] * y[first + i];
        x[segment_channel(seg, order, kv_head, head_dim, j)] = acc;
      }
    }
    __syncthreads();
  }
}

}  // namespace turbokv::cuda::paged
