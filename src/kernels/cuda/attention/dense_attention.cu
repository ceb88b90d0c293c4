// Dense fp16 split-K decode / prefill attention (our own baseline next to PyTorch SDPA).
// Same parts as the TurboQuant kernel (state.cuh), but each warp stages its 32-token K and V
// tiles in shared memory with cp.async (3 stages deep, rows padded to 272 B so ldmatrix is
// conflict-free) and feeds the MMAs with ldmatrix (V transposed). Tokens past a sequence's
// length are zero-filled by cp.async, never read.
#include <cuda_fp16.h>

#include "kernels/cuda/attention/async_copy.cuh"
#include "kernels/cuda/attention/kernels.h"
#include "kernels/cuda/attention/merge.cuh"
#include "kernels/cuda/attention/state.cuh"
#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda::attn {
namespace {

constexpr int kStages = 3;
constexpr int kRowBytes = kHeadDim * 2 + 16;         // 272: padded fp16 row
constexpr int kTileBytes = kTileTokens * kRowBytes;  // one K or V tile
constexpr int kStageBytes = 2 * kTileBytes;          // K then V
constexpr int kWarpBytes = kStages * kStageBytes;
constexpr int kSmemBytes = kWarps * kWarpBytes;  // 208896
static_assert(kSmemBytes >= block_partial_scratch_bytes(kWarps), "block merge scratch fits");

// The paged cache of one (sequence, KV head): block i holds [K: kv_heads][256][128] fp16 then
// [V: kv_heads][256][128] fp16 for tokens 256 i ..
struct DenseSequence {
  const uint8_t* const* table;  // the sequence's block table row
  size_t head_offset;           // bytes to the head's first K row in a block
  size_t v_offset;              // bytes from a K row to the same token's V row
};

// Stages tile `t` (tokens 32t .. 32t+31) into `stage`; a tile lies inside one block.
__device__ __forceinline__ void stage_tile(uint32_t stage, const DenseSequence& seq, int t,
                                           int len, int lane) {
  const __half* k = reinterpret_cast<const __half*>(seq.table[t / kBlockTiles] + seq.head_offset) +
                    size_t(t % kBlockTiles) * kTileTokens * kHeadDim;
  const __half* v = reinterpret_cast<const __half*>(reinterpret_cast<const uint8_t*>(k) +
                                                    seq.v_offset);
#pragma unroll
  for (int i = 0; i < kTileTokens * kHeadDim * 2 / 16 / 32; ++i) {
    const int chunk = i * 32 + lane;
    const int token = chunk / 16, part = chunk % 16;
    const bool valid = t * kTileTokens + token < len;
    const size_t offset = (valid ? size_t(token) * kHeadDim : 0) + part * 8;
    const uint32_t dst = stage + token * kRowBytes + part * 16;
    cp_async_16(dst, k + offset, valid ? 16 : 0);
    cp_async_16(dst + kTileBytes, v + offset, valid ? 16 : 0);
  }
}

__device__ __forceinline__ void process_staged(uint32_t stage, int tile_token0,
                                               const uint32_t (&qf)[8][2], float scale_log2,
                                               const BlockCoords& bc, int lane, WarpState& st) {
  const int g = lane / 4, mi = lane / 8, ri = lane % 8;
  float s[2][4] = {};
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      uint32_t a[4];
      const int token = 16 * mt + ri + 8 * (mi % 2), dim = 16 * kk + 8 * (mi / 2);
      ldmatrix_x4(stage + token * kRowBytes + dim * 2, a);
      mma_16816(s[mt], a[0], a[1], a[2], a[3], qf[kk][0], qf[kk][1]);
    }
  }
  const float kmul[4] = {scale_log2, scale_log2, scale_log2, scale_log2};
  const float vmul[4] = {1, 1, 1, 1};
  uint32_t pb[2][2];
  softmax_any_tile(st, s, kmul, vmul, tile_token0, bc, g, pb);
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) {
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      uint32_t a[4];
      const int token = 16 * kb + ri + 8 * (mi / 2), dim = 16 * mt + 8 * (mi % 2);
      ldmatrix_x4_trans(stage + kTileBytes + token * kRowBytes + dim * 2, a);
      mma_16816(st.acc[mt], a[0], a[1], a[2], a[3], pb[kb][0], pb[kb][1]);
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32) dense_attention_kernel(const AttentionArgs a) {
  extern __shared__ __align__(16) char smem[];
  __shared__ __align__(16) float q_s[kColumns][kHeadDim];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, c = lane % 4;
  if (a.programmatic) wait_for_previous_kernel();  // PDL: everything below reads its inputs
  const BlockCoords bc = block_coords(a, c);
  if (bc.tile_begin >= bc.tile_end) return;

  for (int row = warp; row < kColumns; row += kWarps) {
    load_query_row(a, bc, row, lane, q_s);
  }
  __syncthreads();
  uint32_t qf[8][2];  // natural dim order: k-rows 2c, 2c+1 | 2c+8, 2c+9 of chunk kk
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const float* q = &q_s[g][16 * kk + 2 * c];
    qf[kk][0] = half2_bits(q[0], q[1]);
    qf[kk][1] = half2_bits(q[8], q[9]);
  }

  constexpr size_t kHeadRunBytes = size_t(kBlockTiles) * kTileTokens * kHeadDim * 2;
  const DenseSequence seq{a.block_table + size_t(bc.b) * a.table_stride,
                          size_t(bc.kv_head) * kHeadRunBytes, size_t(a.kv_heads) * kHeadRunBytes};
  const int len = a.seq_lens[bc.b];
  const uint32_t warp_smem = smem_addr(smem + warp * kWarpBytes);

  WarpState st;
  st.init();
  const int first = bc.tile_begin + warp;
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    const int t = first + i * kWarps;
    if (t < bc.tile_end) stage_tile(warp_smem + i * kStageBytes, seq, t, len, lane);
    cp_async_commit();
  }
  for (int i = 0, t = first; t < bc.tile_end; ++i, t += kWarps) {
    cp_async_wait<kStages - 2>();
    __syncwarp();
    const int ahead = t + (kStages - 1) * kWarps;
    if (ahead < bc.tile_end) {
      stage_tile(warp_smem + ((i + kStages - 1) % kStages) * kStageBytes, seq, ahead, len, lane);
    }
    cp_async_commit();
    process_staged(warp_smem + (i % kStages) * kStageBytes, t * kTileTokens, qf, a.scale_log2, bc,
                   lane, st);
    __syncwarp();
  }
  cp_async_wait<0>();
  let_next_kernel_start();  // a PDL-launched successor may now take SMs as blocks finish
  write_block_partial<kWarps>(st, reinterpret_cast<float*>(smem), a, bc, warp, g, c);
  finish_row_group<kWarps>(a, bc, warp, lane);
}

}  // namespace

void launch_dense_attention(const AttentionArgs& args, int batch, cudaStream_t stream) {
  static const bool configured = [] {
    TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(
        dense_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(args.splits, args.kv_heads * args.row_groups, batch);
  launch_attention_kernel(dense_attention_kernel, grid, kWarps * 32, kSmemBytes, stream, args);
}

int dense_attention_blocks_per_sm() {
  TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(dense_attention_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  int blocks = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, dense_attention_kernel, kWarps * 32,
                                                kSmemBytes);
  return blocks > 0 ? blocks : 1;
}

}  // namespace turbokv::cuda::attn
