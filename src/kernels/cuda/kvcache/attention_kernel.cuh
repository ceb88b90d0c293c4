// The split-K pass of paged attention, one template over the block formats (codecs.cuh): plan.h
// describes the work split. Per block: rows' windows and the split's token range, the query
// prologue (rows into the codec frame), the warps' tile loop (cp.async staging, double-buffered
// where the plan allows; online softmax in log2 units, fp32 throughout) and the block combine
// that writes one partial per row. Instantiated per codec in the attention_*.cu files.
#pragma once

#include <climits>

#include "kernels/cuda/kvcache/codecs.cuh"
#include "kernels/cuda/kvcache/device.cuh"
#include "kernels/cuda/kvcache/launch.cuh"
#include "kernels/cuda/kvcache/plan.h"

namespace turbokv::cuda::paged {

constexpr float kLog2e = 1.4426950408889634f;

// Queues the copies of tile `tile` (tokens 32 tile .. 32 tile + 31) of the block's sequence and
// KV head into a warp's stage (warp-collective; commit is the caller's).
__device__ __forceinline__ void stage_tile(const AttnArgs& a, int b, int kv_head, int tile,
                                           uint8_t* stage, int lane) {
  const uint8_t* block = a.table[size_t(b) * a.table_stride + tile / kTilesPerBlock];
  const size_t first_row = size_t(kv_head) * kBlockTokens + (tile % kTilesPerBlock) * kTileTokens;
#pragma unroll
  for (int i = 0; i < kRegions; ++i) {
    const StageRegion& g = a.stage.region[i];
    if (g.row_bytes == 0) continue;
    const uint8_t* src = block + g.section_offset + first_row * g.row_bytes;
    uint8_t* dst = stage + g.smem_offset;
    if (g.unit == 0) {  // the 32 rows are one contiguous span of 32 * row_bytes (a multiple of 32)
      const int chunks = kTileTokens * g.row_bytes / 16;
      for (int c = lane; c < chunks; c += 32) copy_async(dst + 16 * c, src + 16 * c, 16);
    } else {
      const int per_row = g.row_bytes / g.unit;
      for (int c = lane; c < kTileTokens * per_row; c += 32) {
        const int row = c / per_row, part = c % per_row;
        copy_async(dst + row * g.smem_stride + part * g.unit,
                   src + row * g.row_bytes + part * g.unit, g.unit);
      }
    }
  }
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

template <class Codec>
struct WarpState {
  float m[kRows];  // running max of log2-scores (the same in every lane)
  float l[kRows];  // this lane's share of Σ 2^(s - m)
  float acc[kRows][Codec::kE];
};

// One staged tile: scores (lane = token), the online-softmax update, values (lane = dims).
// [tb, te): the block's tokens; row r sees [lo[r], hi[r]).
template <class Codec>
__device__ __forceinline__ void process_tile(const AttnArgs& a, const Codec& codec,
                                             const typename Codec::Tables& tables, QueryShared& qs,
                                             const uint8_t* stage, int tile, int tb, int te,
                                             const int (&lo)[kRows], const int (&hi)[kRows],
                                             WarpState<Codec>& st, int warp, int lane) {
  const StageRegion(&g)[kRegions] = a.stage.region;
  const int tok0 = tile * kTileTokens;
  const int token = tok0 + lane;
  float s[kRows] = {0, 0, 0, 0};
  float value_scale = 0;
  if (token < te) {
    codec.score(stage + g[kKeys].smem_offset + lane * g[kKeys].smem_stride,
                stage + g[kKeyAux].smem_offset + lane * g[kKeyAux].smem_stride, qs, tables, s);
    value_scale =
        codec.value_scale(stage + g[kValueAux].smem_offset + lane * g[kValueAux].smem_stride);
  }
  float pv[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const bool visible = token >= lo[r] && token < hi[r];
    float x = -INFINITY;
    if (visible) {
      float z = s[r] * a.scale;
      if (a.softcap > 0) z = a.softcap * tanhf(z / a.softcap);
      x = z * kLog2e;
    }
    const float m_new = fmaxf(st.m[r], warp_max(x));
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no token yet: 2^(-inf) = 0
    const float alpha = exp2f(st.m[r] - m_use);
    st.m[r] = m_new;
    st.l[r] *= alpha;
#pragma unroll
    for (int e = 0; e < Codec::kE; ++e) st.acc[r][e] *= alpha;
    const float p = exp2f(x - m_use);
    st.l[r] += p;
    pv[r] = visible ? p * value_scale : 0.0f;  // hidden tokens: never 0 * (garbage)
  }
  qs.p[warp][lane] = make_float4(pv[0], pv[1], pv[2], pv[3]);
  __syncwarp();
  const int t_begin = max(tb - tok0, 0), t_end = min(te - tok0, kTileTokens);
  for (int t = t_begin; t < t_end; ++t) {
    const float4 p = qs.p[warp][t];
    if (p.x == 0 && p.y == 0 && p.z == 0 && p.w == 0) continue;  // the same in every lane
    codec.accumulate(stage + g[kValues].smem_offset + t * g[kValues].smem_stride,
                     stage + g[kValueAux].smem_offset + t * g[kValueAux].smem_stride, p, tables,
                     lane, st.acc);
  }
}

template <class Codec>
__global__ void __launch_bounds__(kMaxWarps * 32, 4)
    paged_attention_kernel(const AttnArgs a, const Codec codec) {
  uint8_t* const smem = dynamic_smem();
  __shared__ QueryShared qs;
  __shared__ typename Codec::Tables tables;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warps = a.stage.warps;
  const int b = blockIdx.z, kv_head = blockIdx.y;
  const int row_group = blockIdx.x / a.splits, split = blockIdx.x % a.splits;
  const int len = min(a.seq_len[b], a.table_tokens);
  const int q_first = a.q_start[b];
  const int n_q = a.q_start[b + 1] - q_first;
  const int head_rows = min(n_q, a.max_n_q) * a.group;
  const int split_begin = split * a.split_tokens;
  // Rows past the sequence's queries, splits past its length: nothing to do (the merge reads
  // only the splits below the length).
  if (row_group * kRows >= head_rows || split_begin >= len) return;

  // Row r (head-row hr) is query hr / group of head kv_head * group + hr % group, at position
  // len - n_q + hr / group; it sees [lo, hi) (hi: below its recent tokens). [tb, te): the
  // tokens of this split some row sees.
  int lo[kRows], hi[kRows];
  int lo_min = INT_MAX, hi_max = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int hr = row_group * kRows + r;
    lo[r] = hi[r] = 0;
    if (hr < head_rows) {
      const int pos = len - n_q + hr / a.group;
      hi[r] = max(pos + 1 - a.recent, 0);
      lo[r] = max(a.window > 0 ? max(pos - a.window + 1, 0) : 0, a.key_begin);
    }
    if (lo[r] < hi[r]) {
      lo_min = min(lo_min, lo[r]);
      hi_max = max(hi_max, hi[r]);
    }
  }
  const int tb = max(split_begin, lo_min);
  const int te = min(min(split_begin + a.split_tokens, len), hi_max);

  // Prologue: tables and the rows' queries in the codec frame (the stages serve as scratch).
  codec.load_tables(tables, tid, blockDim.x);
  float* scratch = reinterpret_cast<float*>(smem) + warp * 2 * kMaxHeadDim;
  for (int r = warp; r < kRows; r += warps) {
    const int hr = row_group * kRows + r;
    const float* q = nullptr;
    if (hr < head_rows) {
      const int head = kv_head * a.group + hr % a.group;
      q = a.q + (size_t(q_first + hr / a.group) * a.n_heads + head) * a.head_dim;
    }
    codec.load_query(q, r, kv_head, b, qs, scratch, lane);
  }
  __syncthreads();

  WarpState<Codec> st;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    st.m[r] = -INFINITY;
    st.l[r] = 0;
#pragma unroll
    for (int e = 0; e < Codec::kE; ++e) st.acc[r][e] = 0;
  }
  if (tb < te) {
    const int tile_last = (te - 1) / kTileTokens;
    const int stage_bytes = a.stage.stage_bytes;
    const bool double_buffer = a.stage.stages == 2;
    uint8_t* stages = smem + warp * a.stage.stages * stage_bytes;
    int tile = tb / kTileTokens + warp;
    if (tile <= tile_last) {
      stage_tile(a, b, kv_head, tile, stages, lane);
      copy_async_commit();
    }
    for (int k = 0; tile <= tile_last; ++k, tile += warps) {
      const int next = tile + warps;
      const uint8_t* current = stages + (double_buffer ? (k & 1) * stage_bytes : 0);
      if (double_buffer && next <= tile_last) {
        stage_tile(a, b, kv_head, next, stages + ((k + 1) & 1) * stage_bytes, lane);
        copy_async_commit();
        copy_async_wait<1>();  // all but the newest group: the current tile is in
      } else {
        copy_async_wait<0>();
      }
      __syncwarp();
      process_tile(a, codec, tables, qs, current, tile, tb, te, lo, hi, st, warp, lane);
      __syncwarp();  // every lane is done with the stage and qs.p before they are refilled
      if (!double_buffer && next <= tile_last) {
        stage_tile(a, b, kv_head, next, stages, lane);
        copy_async_commit();
      }
    }
  }

  // Block combine: out = Σ_w 2^(m_w - M) acc_w over the warps, M = max_w m_w (the stages are
  // reused as [warps][kRows][head_dim] acc + [warps][kRows] m + [warps][kRows] l).
  __syncthreads();
  const int dim = a.head_dim;
  float* c_acc = reinterpret_cast<float*>(smem);
  float* c_m = c_acc + warps * kRows * dim;
  float* c_l = c_m + warps * kRows;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float l = warp_sum(st.l[r]);
    if (lane == 0) {
      c_m[warp * kRows + r] = st.m[r];
      c_l[warp * kRows + r] = l;
    }
#pragma unroll
    for (int e = 0; e < Codec::kE; ++e) {
      const int d = codec.value_dim(lane, e);
      if (d < dim) c_acc[(warp * kRows + r) * dim + d] = st.acc[r][e];
    }
  }
  __syncthreads();
  for (int i = tid; i < kRows * dim; i += blockDim.x) {
    const int r = i / dim, d = i % dim;
    const int hr = row_group * kRows + r;
    if (hr >= head_rows) continue;
    float m = -INFINITY;
    for (int w = 0; w < warps; ++w) m = fmaxf(m, c_m[w * kRows + r]);
    float acc = 0, l = 0;
    if (m != -INFINITY) {
      for (int w = 0; w < warps; ++w) {
        const float weight = exp2f(c_m[w * kRows + r] - m);
        acc += weight * c_acc[(w * kRows + r) * dim + d];
        l += weight * c_l[w * kRows + r];
      }
    }
    const int head = kv_head * a.group + hr % a.group;
    const size_t p = ((size_t(b) * a.max_n_q + hr / a.group) * a.n_heads + head) * a.splits + split;
    a.part_acc[p * dim + d] = acc;
    if (d == 0) a.part_ml[p] = make_float2(m, l);
  }
}

// Launches the split pass for `codec` (grid: row groups x splits, KV heads, sequences).
template <class Codec>
void launch_attention(const AttnArgs& a, const Codec& codec, cudaStream_t stream) {
  static const bool configured = [] {
    allow_dynamic_smem(paged_attention_kernel<Codec>, kMaxDynamicSmem);
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned(a.row_groups) * unsigned(a.splits), unsigned(a.kv_heads),
                  unsigned(a.batch));
  launch_kernel(paged_attention_kernel<Codec>, grid, dim3(a.stage.warps * 32),
                size_t(a.stage.smem_bytes), stream, a, codec);
}

}  // namespace turbokv::cuda::paged
