// Building blocks shared by the attention kernels (flashinfer-style "from parts"):
// tensor-core wrappers, the online-softmax state {m, l, acc} of one warp over a 32-token tile,
// and the block-level merge that writes one split's partial result.
//
// Fragment conventions (PTX m16n8k16, g = lane / 4, c = lane % 4):
//  score MMA  S[token, column] = K[token, dim] · Q^T[dim, column]   (A = keys, B = queries)
//  value MMA  O^T[dim, column] += V^T[dim, token] · P^T[token, column]  (A = values, B = probs)
// A thread owns columns 2c, 2c+1 of every score tile (tokens g, g + 8) and of O^T
// (dims 16*mt + g, 16*mt + g + 8).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/attention/params.h"

namespace turbokv::cuda::attn {

__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Transposes an 8x8 f16 matrix held in fragment layout (row g, cols 2c, 2c+1).
__device__ __forceinline__ uint32_t transpose_8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (AttentionArgs::programmatic): wait_for_previous_kernel()
// returns once the kernel before this one on the stream has completed and its writes are
// visible (at once when not launched with PDL); let_next_kernel_start() allows the next
// kernel, if launched with PDL, to begin its own prologue (it still waits for this one).
__device__ __forceinline__ void wait_for_previous_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void let_next_kernel_start() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Profiling: thread 0 records `value` (default: %globaltimer) at `point` of this block's
// timeline when the caller asked for one (AttentionArgs::timeline).
__device__ __forceinline__ void stamp(const AttentionArgs& a, int point, long long value = -1) {
  if (a.timeline == nullptr || threadIdx.x != 0) return;
  unsigned long long t = value;
  if (value < 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  a.timeline[size_t(block) * kTimelinePoints + point] = t;
}

// Block coordinates and the token limits of the two columns this thread owns.
struct BlockCoords {
  int b, kv_head, row_group, split;
  int n_tiles;               // tiles of the sequence
  int tile_begin, tile_end;  // tiles of this split that hold tokens
  int limit[2];              // column 2c + i sees tokens < limit[i] (0: padding column)
  int unmasked_end;          // tokens below this are visible to every row of the group
};

// The grid coordinates only (no memory reads).
__device__ __forceinline__ BlockCoords block_position(const AttentionArgs& a) {
  BlockCoords bc;
  bc.split = blockIdx.x;
  bc.kv_head = blockIdx.y / a.row_groups;
  bc.row_group = blockIdx.y % a.row_groups;
  bc.b = blockIdx.z;
  return bc;
}

// Completes block_position() once the sequence's length is known.
__device__ __forceinline__ void set_block_limits(const AttentionArgs& a, int len, int c,
                                                 BlockCoords& bc) {
  bc.n_tiles = (len + kTileTokens - 1) / kTileTokens;
  bc.tile_begin = bc.split * a.tiles_per_split;
  bc.tile_end = min(bc.tile_begin + a.tiles_per_split, bc.n_tiles);
  bc.unmasked_end = len - a.n_q + bc.row_group * kColumns / a.group + 1;
  for (int i = 0; i < 2; ++i) {
    const int row = bc.row_group * kColumns + 2 * c + i;
    bc.limit[i] = row < a.rows ? len - a.n_q + row / a.group + 1 : 0;
  }
}

__device__ __forceinline__ BlockCoords block_coords(const AttentionArgs& a, int c) {
  BlockCoords bc = block_position(a);
  set_block_limits(a, a.seq_lens[bc.b], c, bc);
  return bc;
}

// Row `col` of this block's query rows: pointer into q (nullptr for padding columns).
__device__ __forceinline__ const float* query_row(const AttentionArgs& a, const BlockCoords& bc,
                                                  int col) {
  const int row = bc.row_group * kColumns + col;
  if (row >= a.rows) return nullptr;
  const int qi = row / a.group;
  const int head = bc.kv_head * a.group + row % a.group;
  return a.q + ((size_t(bc.b) * a.n_q + qi) * a.n_heads + head) * kHeadDim;
}

struct WarpState {
  float m[2];       // running max of log2-scores, columns 2c, 2c+1
  float l[2];       // running sum of 2^(s - m) over this thread's tokens
  float acc[8][4];  // O^T fragments, one per 16-dim tile

  __device__ __forceinline__ void init() {
    for (int i = 0; i < 2; ++i) {
      m[i] = -INFINITY;
      l[i] = 0;
    }
    for (int t = 0; t < 8; ++t)
      for (int j = 0; j < 4; ++j) acc[t][j] = 0;
  }
};

// True when some token of the tile at tile_token0 is hidden from some row (the last tile, or
// causal prefill): then softmax_tile<true> masks per token.
__device__ __forceinline__ bool tile_needs_mask(const BlockCoords& bc, int tile_token0) {
  return tile_token0 + kTileTokens > bc.unmasked_end;
}

// softmax_tile's lazy max (log2 units): probabilities stay <= 2^kLazySlack = 16, so the fp16
// value-MMA operands p * value norm stay finite for value norms up to kMaxPlainValueNorm;
// value_operand_scale() scales larger norms down.
constexpr float kLazySlack = 4.0f;

// The power of two the value norms are multiplied by (1 unless the cache holds a value norm
// above kMaxPlainValueNorm; args.value_norm_max, device float bits).
__device__ __forceinline__ float value_operand_scale(const AttentionArgs& a) {
  if (a.value_norm_max == nullptr) return 1.0f;
  const float max_norm = __uint_as_float(*a.value_norm_max);
  if (!(max_norm > kMaxPlainValueNorm)) return 1.0f;
  return exp2f(-ceilf(log2f(max_norm / kMaxPlainValueNorm)));
}

// One 32-token tile: raw scores s[m-tile][frag] (token 16*mt + g + 8*(frag/2), column
// 2c + frag%2), per-slot multipliers (slot = 2*mt + frag/2) that bring the scores to log2
// units (TurboQuant: the key norm, the query carries scale * log2 e; dense: scale * log2 e) and
// for the probabilities (value norm). Updates the state and returns the
// probability tiles as B operands of the value MMA: pb[mt] = P^T rows 16*mt .. 16*mt + 15.
// kMask = false: every token of the tile is visible to every real row (padding rows then
// score 0 against finite norms, harmless and never written out).
template <bool kMask>
__device__ __forceinline__ void softmax_tile(WarpState& st, const float (&s)[2][4],
                                             const float (&kmul)[4], const float (&vmul)[4],
                                             int tile_token0, const int (&limit)[2], int g,
                                             uint32_t (&pb)[2][2]) {
  float x[2][4];
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int slot = 2 * mt + j / 2;
      const int token = tile_token0 + 16 * mt + g + 8 * (j / 2);
      x[mt][j] = !kMask || token < limit[j % 2] ? s[mt][j] * kmul[slot] : -INFINITY;
      tile_max[j % 2] = fmaxf(tile_max[j % 2], x[mt][j]);
    }
  }
  float m_use[2], alpha[2];
  bool grew = false;
  // Lazy max: the running max m stays unless some score of the tile exceeds it by more than
  // kLazySlack (the tile's probabilities are then <= 2^kLazySlack, fine for fp16 and the fp32
  // sums); only then is the tile max reduced across lanes and the state rescaled: one vote
  // instead of three shuffle rounds on most tiles.
  if (!__any_sync(0xffffffffu,
                  tile_max[0] > st.m[0] + kLazySlack || tile_max[1] > st.m[1] + kLazySlack)) {
#pragma unroll
    for (int i = 0; i < 2; ++i) m_use[i] = st.m[i] == -INFINITY ? 0.0f : st.m[i];
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 4));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 8));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 16));
      const float m_new = fmaxf(st.m[i], tile_max[i]);
      m_use[i] = m_new == -INFINITY ? 0.0f : m_new;  // no token seen yet: keep 2^(-inf) = 0
      alpha[i] = fast_exp2(st.m[i] - m_use[i]);
      grew |= m_new != st.m[i];
      st.m[i] = m_new;
      st.l[i] *= alpha[i];
    }
    if (__any_sync(0xffffffffu, grew)) {  // alpha == 1 exactly for every column otherwise
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        st.acc[t][0] *= alpha[0];
        st.acc[t][2] *= alpha[0];
        st.acc[t][1] *= alpha[1];
        st.acc[t][3] *= alpha[1];
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    float pv[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int slot = 2 * mt + j / 2;
      const int token = tile_token0 + 16 * mt + g + 8 * (j / 2);
      const float p = fast_exp2(x[mt][j] - m_use[j % 2]);
      st.l[j % 2] += p;
      pv[j] = !kMask || token < limit[j % 2] ? p * vmul[slot] : 0.0f;  // hidden norms: garbage
    }
    pb[mt][0] = transpose_8x8(half2_bits(pv[0], pv[1]));
    pb[mt][1] = transpose_8x8(half2_bits(pv[2], pv[3]));
  }
}

// softmax_tile for the tile at tile_token0, masking per token only where tile_needs_mask says
// some token is hidden from some row.
__device__ __forceinline__ void softmax_any_tile(WarpState& st, const float (&s)[2][4],
                                                 const float (&kmul)[4], const float (&vmul)[4],
                                                 int tile_token0, const BlockCoords& bc, int g,
                                                 uint32_t (&pb)[2][2]) {
  if (tile_needs_mask(bc, tile_token0)) {
    softmax_tile<true>(st, s, kmul, vmul, tile_token0, bc.limit, g, pb);
  } else {
    softmax_tile<false>(st, s, kmul, vmul, tile_token0, bc.limit, g, pb);
  }
}

// Partials go through the workspace as fp32 bits XOR kPartialKey, written and read with
// relaxed gpu-scope accesses (each 32-bit word on its own): a zero word (the workspace between
// calls) is one not written yet, so the merger waits on the data itself, with no flag and no
// fence between writing a partial and publishing it. No result of arithmetic encodes to 0:
// kPartialKey is a signaling NaN, and NVIDIA arithmetic only ever returns the canonical NaN.
constexpr uint32_t kPartialKey = 0x7FBADBADu;

__device__ __forceinline__ uint32_t encode_partial(float x) {
  return __float_as_uint(x) ^ kPartialKey;
}
__device__ __forceinline__ float decode_partial(uint32_t w) {
  return __uint_as_float(w ^ kPartialKey);
}

__device__ __forceinline__ void store_relaxed(uint4* p, uint4 x) {
  asm volatile("st.relaxed.gpu.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(x.x), "r"(x.y),
               "r"(x.z), "r"(x.w)
               : "memory");
}
__device__ __forceinline__ void store_relaxed(uint2* p, uint2 x) {
  asm volatile("st.relaxed.gpu.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(x.x), "r"(x.y)
               : "memory");
}
__device__ __forceinline__ uint4 load_relaxed(const uint4* p) {
  uint4 x;
  asm volatile("ld.relaxed.gpu.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
               : "l"(p)
               : "memory");
  return x;
}
__device__ __forceinline__ uint2 load_relaxed(const uint2* p) {
  uint2 x;
  asm volatile("ld.relaxed.gpu.global.v2.b32 {%0, %1}, [%2];"
               : "=r"(x.x), "=r"(x.y)
               : "l"(p)
               : "memory");
  return x;
}

// Shared-memory rows of the block merge are padded to kPartialRow floats: the stores of a
// fragment (lanes 4g + c: column 2c + i, dim g + ...) then hit 32 different banks, and rows stay
// 16-B aligned for the combine's float4 loads.
constexpr int kPartialRow = kHeadDim + 4;
constexpr size_t block_partial_scratch_bytes(int num_warps) {
  return sizeof(float) * num_warps * kColumns * (kPartialRow + 2);
}

// Combines the block's warps and writes this split's partial (acc, m, l) for its rows.
// scratch: block_partial_scratch_bytes(kNumWarps) of shared memory that no warp reads once
// every warp has arrived here.
template <int kNumWarps>
__device__ __forceinline__ void write_block_partial(WarpState& st, float* scratch,
                                                    const AttentionArgs& a, const BlockCoords& bc,
                                                    int warp, int g, int c) {
  for (int i = 0; i < 2; ++i) {
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 4);
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 8);
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 16);
  }
  float* s_acc = scratch;                                     // [kNumWarps, kColumns, kPartialRow]
  float* s_m = scratch + kNumWarps * kColumns * kPartialRow;  // [kNumWarps, kColumns]
  float* s_l = s_m + kNumWarps * kColumns;                    // [kNumWarps, kColumns]
  const int columns = min(kColumns, a.rows - bc.row_group * kColumns);  // real query rows
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (2 * c + i >= columns) continue;  // padding columns are never written out
    float* row = s_acc + (warp * kColumns + 2 * c + i) * kPartialRow + g;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      row[16 * t] = st.acc[t][i];
      row[16 * t + 8] = st.acc[t][i + 2];
    }
    if (g == 0) {
      s_m[warp * kColumns + 2 * c + i] = st.m[i];
      s_l[warp * kColumns + 2 * c + i] = st.l[i];
    }
  }
  __syncthreads();
  // out = sum_w 2^(m_w - m) acc_w with m = max_w m_w (weight 0 where a warp saw no token).
  // Thread (col, lane) combines dims 4 lane .. 4 lane + 3 of column col: every load of the
  // warps' partials is independent (broadcast m and l, one 16-B acc load per warp).
  const size_t first =
      ((size_t(bc.b) * a.kv_heads + bc.kv_head) * a.rows + bc.row_group * kColumns) * a.splits +
      bc.split;
  for (int idx = threadIdx.x; idx < columns * 32; idx += blockDim.x) {
    const int col = idx / 32, d4 = idx % 32;
    float wm[kNumWarps];
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kNumWarps; ++w) {
      wm[w] = s_m[w * kColumns + col];
      m = fmaxf(m, wm[w]);
    }
    float4 acc = make_float4(0, 0, 0, 0);
    float l = 0;
    if (m != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kNumWarps; ++w) {
        const float weight = fast_exp2(wm[w] - m);
        const float4 x =
            reinterpret_cast<const float4*>(s_acc + (w * kColumns + col) * kPartialRow)[d4];
        acc.x += x.x * weight, acc.y += x.y * weight, acc.z += x.z * weight, acc.w += x.w * weight;
        l += s_l[w * kColumns + col] * weight;
      }
    }
    const size_t p = first + size_t(col) * a.splits;
    store_relaxed(a.part_acc + p * (kHeadDim / 4) + d4,
                  make_uint4(encode_partial(acc.x), encode_partial(acc.y), encode_partial(acc.z),
                             encode_partial(acc.w)));
    if (d4 == 0) store_relaxed(a.part_ml + p, make_uint2(encode_partial(m), encode_partial(l)));
  }
}

// Lane's 4 dims of query row `warp` of the block (zeros for padding rows and warps past the
// block's kColumns rows).
__device__ __forceinline__ float4 fetch_query_row(const AttentionArgs& a, const BlockCoords& bc,
                                                  int warp, int lane) {
  if (warp >= kColumns) return make_float4(0, 0, 0, 0);
  const float* q = query_row(a, bc, warp);
  return q != nullptr ? reinterpret_cast<const float4*>(q)[lane] : make_float4(0, 0, 0, 0);
}

// A 128-dim row spread over a warp, lane l holding dims 4l .. 4l+3 (the query rotation and
// the merge's inverse rotation). Sign-flip word of the lane's dims: they are bits
// (4l + j) % 32 of word l / 8 of the 128-bit mask (constant indices keep the mask, a kernel
// argument, out of local memory).
__device__ __forceinline__ uint32_t lane_flip_word(uint4 flips, int lane) {
  return lane < 8 ? flips.x : lane < 16 ? flips.y : lane < 24 ? flips.z : flips.w;
}

// o = H o (unnormalized Walsh-Hadamard): butterflies h = 1, 2 in the lane, h >= 4 by shuffles.
__device__ __forceinline__ void hadamard_row(float (&o)[4], int lane) {
#pragma unroll
  for (int h = 1; h <= 2; h *= 2) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j & h) continue;
      const float u = o[j], v = o[j + h];
      o[j] = u + v;
      o[j + h] = u - v;
    }
  }
#pragma unroll
  for (int h = 4; h < kHeadDim; h *= 2) {
    const bool upper = lane & (h / 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, o[j], h / 4);
      o[j] = upper ? other - o[j] : o[j] + other;
    }
  }
}

// H diag(s) x of one row (x4 in, o out), without the scale.
__device__ __forceinline__ void rotate_row(float4 x4, int lane, uint4 flips, float (&o)[4]) {
  o[0] = x4.x, o[1] = x4.y, o[2] = x4.z, o[3] = x4.w;
  const uint32_t word = lane_flip_word(flips, lane);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if ((word >> ((4 * lane + j) % 32)) & 1u) o[j] = -o[j];
  }
  hadamard_row(o, lane);
}

// Query row `warp` of the block, unrotated, into q_rows[warp] (the dense kernel).
__device__ __forceinline__ void load_query_row(const AttentionArgs& a, const BlockCoords& bc,
                                               int warp, int lane, float (*q_rows)[kHeadDim]) {
  reinterpret_cast<float4*>(q_rows[warp])[lane] = fetch_query_row(a, bc, warp, lane);
}

}  // namespace turbokv::cuda::attn
