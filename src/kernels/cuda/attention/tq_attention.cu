// Fused TurboQuant 3.5 attention (decode, and prefill over a quantized past) on packed codes
// in the tile format of tq_layout.h. One block of 16 warps per SM; per block: rotate its 8
// query rows once (R q), then each warp streams its 32-token tiles through a 2-stage cp.async
// pipeline in shared memory and
//  - turns each 6-bit key pair / 8-bit value pair into an f16x2 tensor-core operand with one
//    lane-private shared-memory table lookup (conflict-free: entry e of lane L at
//    256*e + 4L; the address is one funnel shift + LOP3 for keys, one byte_perm for values),
//  - scores = key norm * <R q, c[idx]> (MMA), online softmax in base 2,
//  - accumulates value norm * p * c[idx] in the rotated frame (MMA).
// The last block of a row group to finish merges the splits and rotates back (merge.cuh).
#include <cuda_fp16.h>

#include "kernels/cuda/attention/async_copy.cuh"
#include "kernels/cuda/attention/kernels.h"
#include "kernels/cuda/attention/merge.cuh"
#include "kernels/cuda/attention/state.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tq_layout.h"

namespace turbokv::cuda::attn {
namespace {

using L = TQ35Layout;

constexpr int kTQWarps = 16;  // one block per SM: the tables are filled once per SM
constexpr int kTQStages = 2;  // per warp: 1 tile loading while 1 is computed
constexpr int kStageSlots = kTQWarps * kTQStages;
// Operand tables, row e (256 B): [value pair e, lanes 0..31][key pair e (e < 64), lanes 0..31].
// They sit at a 64 KB-aligned shared address A, so a lookup address is one LOP3 (keys) or one
// byte_perm (values) of the code word and (A + 4 * lane), with no add.
constexpr int kTableRowBytes = 256;
constexpr int kTableBytes = 256 * kTableRowBytes;
constexpr int kKeyTableOffset = 128;
// Stage slots fill the gap below the tables, the rest follow them; the worst gap needs
// kTileBytes - 1 extra bytes.
constexpr int kTQSmemBytes = kTableBytes + kStageSlots * L::kTileBytes + L::kTileBytes;
static_assert(L::kTileBytes % 16 == 0, "tiles are copied in 16-B chunks");

// Where the tables and stage slots are inside the dynamic shared buffer (runtime base).
struct SmemPlan {
  uint32_t table_offset;  // (base + table_offset) % 65536 == 0
  int low_slots;          // slots below the tables
  __device__ __forceinline__ explicit SmemPlan(uint32_t base)
      : table_offset((65536u - base % 65536u) % 65536u),
        low_slots(min(kStageSlots, int(table_offset) / L::kTileBytes)) {}
  __device__ __forceinline__ uint32_t slot_offset(int slot) const {
    return slot < low_slots ? uint32_t(slot) * L::kTileBytes
                            : table_offset + kTableBytes + uint32_t(slot - low_slots) * L::kTileBytes;
  }
};

struct TileRegs {
  uint32_t k[L::kKeyWordsPerLane];    // 4 slots x 96 bits of 3-bit key codes
  uint32_t v[L::kValueWordsPerLane];  // 16 words of 4-bit value code pairs
  uint32_t n[4];                      // per slot: (key norm, value norm) fp16
};

// Queues the copy of one tile (3712 B, 232 chunks) into a stage: lane L copies chunks
// L, L + 32, ... (dst and src already include 16 * L; the chunk offsets are immediates).
template <int kChunk>
__device__ __forceinline__ void cp_async_chunk(uint32_t dst, const uint8_t* src) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%2], 16;" ::"r"(dst), "l"(src),
               "n"(16 * kChunk));
}

__device__ __forceinline__ void stage_tile(uint32_t stage_lane, const uint8_t* tile_lane,
                                           int lane) {
  constexpr int kChunks = L::kTileBytes / 16;
  static_assert(kChunks > 224 && kChunks <= 256, "8 rounds of 32 chunks");
  cp_async_chunk<0>(stage_lane, tile_lane);
  cp_async_chunk<32>(stage_lane, tile_lane);
  cp_async_chunk<64>(stage_lane, tile_lane);
  cp_async_chunk<96>(stage_lane, tile_lane);
  cp_async_chunk<128>(stage_lane, tile_lane);
  cp_async_chunk<160>(stage_lane, tile_lane);
  cp_async_chunk<192>(stage_lane, tile_lane);
  if (224 + lane < kChunks) cp_async_chunk<224>(stage_lane, tile_lane);
}

__device__ __forceinline__ void read_stage(const char* stage, int lane, TileRegs& r) {
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const uint4 x = *reinterpret_cast<const uint4*>(stage + 512 * i + 16 * lane);
    r.k[4 * i] = x.x, r.k[4 * i + 1] = x.y, r.k[4 * i + 2] = x.z, r.k[4 * i + 3] = x.w;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 x = *reinterpret_cast<const uint4*>(stage + L::kValueOffset + 512 * i + 16 * lane);
    r.v[4 * i] = x.x, r.v[4 * i + 1] = x.y, r.v[4 * i + 2] = x.z, r.v[4 * i + 3] = x.w;
  }
  const uint4 x = *reinterpret_cast<const uint4*>(stage + L::kNormOffset + 16 * (lane / 4));
  r.n[0] = x.x, r.n[1] = x.y, r.n[2] = x.z, r.n[3] = x.w;
}

// The 6-bit key pair at bit `pos` of the lane's record, moved to bits [8, 14) (other bits
// are garbage): its table row. pos is a compile-time constant after unrolling.
__device__ __forceinline__ uint32_t key_pair_row(const uint32_t (&k)[L::kKeyWordsPerLane],
                                                 int pos) {
  if (pos < 8) return k[0] << (8 - pos);
  const int shift = pos - 8, word = shift / 32, bit = shift % 32;
  if (bit + 14 <= 32) return k[word] >> bit;
  return __funnelshift_r(k[word], k[word + 1 < L::kKeyWordsPerLane ? word + 1 : word], bit);
}

// lane_table = A + 4 * lane (shared address, A the 64 KB-aligned table base).
template <int kOffset>
__device__ __forceinline__ uint32_t table_load(uint32_t address) {
  uint32_t v;
  asm("ld.shared.u32 %0, [%1+%2];" : "=r"(v) : "r"(address), "n"(kOffset));
  return v;
}

__device__ __forceinline__ uint32_t key_operand(uint32_t lane_table,
                                                const uint32_t (&k)[L::kKeyWordsPerLane],
                                                int slot, int pair) {
  const uint32_t row = key_pair_row(k, 96 * slot + 6 * pair);
  return table_load<kKeyTableOffset>((row & 0x3F00u) | lane_table);
}

// Byte j of the value word becomes address byte 1 (the row); bytes 0, 2, 3 come from
// lane_table.
__device__ __forceinline__ uint32_t value_operand(uint32_t lane_table, uint32_t word, int j) {
  return table_load<0>(__byte_perm(word, lane_table, 0x7604u | (uint32_t(j) << 4)));
}

__device__ __forceinline__ void process_tile(const TileRegs& r, int tile_token0,
                                             const uint32_t (&qf)[8][2], uint32_t lane_table,
                                             float scale_log2,
                                             const BlockCoords& bc, int g, WarpState& st) {
  float s[2][4] = {};
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      mma_16816(s[mt], key_operand(lane_table, r.k, 2 * mt, 2 * kk),
                key_operand(lane_table, r.k, 2 * mt + 1, 2 * kk),
                key_operand(lane_table, r.k, 2 * mt, 2 * kk + 1),
                key_operand(lane_table, r.k, 2 * mt + 1, 2 * kk + 1), qf[kk][0], qf[kk][1]);
    }
  }
  float kmul[4], vmul[4];
#pragma unroll
  for (int slot = 0; slot < 4; ++slot) {
    const __half2 norms = *reinterpret_cast<const __half2*>(&r.n[slot]);
    kmul[slot] = __low2float(norms) * scale_log2;
    vmul[slot] = __high2float(norms);
  }
  uint32_t pb[2][2];
  if (tile_needs_mask(bc, tile_token0)) {
    softmax_tile<true>(st, s, kmul, vmul, tile_token0, bc.limit, g, pb);
  } else {
    softmax_tile<false>(st, s, kmul, vmul, tile_token0, bc.limit, g, pb);
  }
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) {
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      const uint32_t w = r.v[8 * kb + mt];
      mma_16816(st.acc[mt], value_operand(lane_table, w, 0),
                value_operand(lane_table, w, 1), value_operand(lane_table, w, 2),
                value_operand(lane_table, w, 3), pb[kb][0], pb[kb][1]);
    }
  }
}

__global__ void __launch_bounds__(kTQWarps * 32, 1)
    tq_attention_kernel(const AttentionArgs a, const TQKernelCodec codec, const uint8_t* tiles,
                        int max_tiles) {
  extern __shared__ __align__(16) char smem[];  // stage slots, operand tables (SmemPlan)
  __shared__ float q_rot[kColumns][kHeadDim];   // rotated query rows

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, c = lane % 4;
  const BlockCoords bc = block_coords(a, c);
  if (bc.tile_begin >= bc.tile_end) return;  // split past this sequence's end (whole block)

  const uint32_t smem_base = smem_addr(smem);
  const SmemPlan plan(smem_base);
  // Start streaming first: the table and query set-up overlaps the first loads.
  const uint8_t* seq_tiles = tiles +
                             (size_t(bc.b) * a.kv_heads + bc.kv_head) * size_t(max_tiles) *
                                 L::kTileBytes +
                             16 * lane;
  static_assert(kTQStages == 2, "the loop below alternates two stages");
  // This lane's chunk 0 in the stage being read and in the one being filled.
  uint32_t stage_read = smem_base + plan.slot_offset(2 * warp) + 16 * lane;
  uint32_t stage_fill = smem_base + plan.slot_offset(2 * warp + 1) + 16 * lane;
  const int first = bc.tile_begin + warp;
  if (first < bc.tile_end) stage_tile(stage_read, seq_tiles + size_t(first) * L::kTileBytes, lane);
  cp_async_commit();

  char* tables = smem + plan.table_offset;
  for (int e = warp; e < 256; e += kTQWarps) {
    char* row = tables + e * kTableRowBytes + 4 * lane;
    *reinterpret_cast<uint32_t*>(row) =
        half2_bits(codec.value_centroids[e % 16], codec.value_centroids[e / 16]);
    if (e < 64) {
      *reinterpret_cast<uint32_t*>(row + kKeyTableOffset) =
          half2_bits(codec.key_centroids[e % 8], codec.key_centroids[e / 8]);
    }
  }
  // R q = H (s ⊙ q) * scale: sign flips, then the butterflies in shared memory.
  for (int idx = threadIdx.x; idx < kColumns * kHeadDim; idx += blockDim.x) {
    const int col = idx / kHeadDim, d = idx % kHeadDim;
    const float* q = query_row(a, bc, col);
    const float x = q != nullptr ? q[d] : 0.0f;
    q_rot[col][d] = (codec.key_sign_flips[d / 32] >> (d % 32)) & 1u ? -x : x;
  }
  for (int h = 1; h < kHeadDim; h *= 2) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kColumns * kHeadDim / 2; idx += blockDim.x) {
      const int col = idx / (kHeadDim / 2), j = idx % (kHeadDim / 2);
      const int lo = (j / h) * 2 * h + j % h;
      const float x = q_rot[col][lo], y = q_rot[col][lo + h];
      q_rot[col][lo] = x + y;
      q_rot[col][lo + h] = x - y;
    }
  }
  __syncthreads();
  // B operands of the score MMA: k-rows 2c, 2c+1 | 2c+8, 2c+9 of chunk kk are rotated dims
  // 32c + 4kk + {0, 1} | {2, 3} (the key tile layout's pairing), column g.
  uint32_t qf[8][2];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const float* q = &q_rot[g][32 * c + 4 * kk];
    qf[kk][0] = half2_bits(q[0] * codec.hadamard_scale, q[1] * codec.hadamard_scale);
    qf[kk][1] = half2_bits(q[2] * codec.hadamard_scale, q[3] * codec.hadamard_scale);
  }
  const uint32_t lane_table = smem_base + plan.table_offset + 4 * lane;

  WarpState st;
  st.init();
  for (int t = first; t < bc.tile_end; t += kTQWarps) {
    cp_async_wait<0>();
    __syncwarp();
    TileRegs r;
    read_stage(smem + (stage_read - smem_base) - 16 * lane, lane, r);
    __syncwarp();  // every lane has its copy before that stage is refilled next round
    const int ahead = t + kTQWarps;
    if (ahead < bc.tile_end) stage_tile(stage_fill, seq_tiles + size_t(ahead) * L::kTileBytes, lane);
    cp_async_commit();
    const uint32_t filled = stage_fill;
    stage_fill = stage_read;
    stage_read = filled;
    process_tile(r, t * kTileTokens, qf, lane_table, a.scale_log2, bc, g, st);
  }
  cp_async_wait<0>();
  // Merge scratch: from the tables on, at least kTableBytes + kTileBytes bytes are ours.
  static_assert(kTableBytes + L::kTileBytes >=
                    sizeof(float) * kTQWarps * (kColumns * kHeadDim + 2 * kColumns),
                "merge scratch fits");
  write_block_partial<kTQWarps>(st, reinterpret_cast<float*>(tables), a, bc, warp, g, c);
  finish_row_group<kTQWarps>(a, bc, warp, lane);
}

}  // namespace

void launch_tq_attention(const AttentionArgs& args, const TQKernelCodec& codec,
                         const uint8_t* tiles, int max_tiles, int batch, cudaStream_t stream) {
  const dim3 grid(args.splits, args.kv_heads * args.row_groups, batch);
  static const bool configured = [] {
    TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(
        tq_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTQSmemBytes));
    return true;
  }();
  (void)configured;
  tq_attention_kernel<<<grid, kTQWarps * 32, kTQSmemBytes, stream>>>(args, codec, tiles,
                                                                     max_tiles);
}

int tq_attention_blocks_per_sm() {
  TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(
      tq_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTQSmemBytes));
  int blocks = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, tq_attention_kernel, kTQWarps * 32,
                                                kTQSmemBytes);
  return blocks > 0 ? blocks : 1;
}

}  // namespace turbokv::cuda::attn
