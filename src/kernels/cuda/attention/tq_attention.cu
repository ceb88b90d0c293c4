// Fused TurboQuant 3.5 attention (decode, and prefill over a quantized past) on packed codes
// in the tile format of tq_layout.h. One block of 12 warps per SM; per block: rotate its 8
// query rows once (R q), then each warp streams its 32-token tiles through a 3-stage cp.async
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

// Operand tables, row e (256 B): [value pair e, lanes 0..31][key pair e (e < 64), lanes 0..31].
// They sit at a 64 KB-aligned shared address A, so a lookup address is one LOP3 (keys) or one
// byte_perm (values) of the code word and (A + 4 * lane), with no add.
constexpr int kTableRowBytes = 256;
constexpr int kTableBytes = 256 * kTableRowBytes;
constexpr int kKeyTableOffset = 128;
static_assert(L::kTileBytes % 16 == 0, "tiles are copied in 16-B chunks");

// Block shape: kWarps warps (one block per SM, the tables filled once per SM), each streaming
// its tiles through kStages shared-memory stages (kStages - 1 tiles in flight).
template <int kWarps, int kStages>
struct TQShape {
  static constexpr int kStageSlots = kWarps * kStages;
  // Stage slots fill the gap below the tables, the rest follow them; the worst gap costs
  // kTileBytes - 1 extra bytes.
  static constexpr int kSmemBytes = kTableBytes + (kStageSlots + 1) * L::kTileBytes;
  static_assert(kTableBytes + L::kTileBytes >=
                    sizeof(float) * kWarps * (kColumns * kHeadDim + 3 * kColumns),
                "the block merge's scratch fits from the tables on");
};

// Where the tables and stage slots are inside the dynamic shared buffer (runtime base).
struct SmemPlan {
  uint32_t table_offset;  // (base + table_offset) % 65536 == 0
  int low_slots;          // slots below the tables
  __device__ __forceinline__ SmemPlan(uint32_t base, int slots)
      : table_offset((65536u - base % 65536u) % 65536u),
        low_slots(min(slots, int(table_offset) / L::kTileBytes)) {}
  __device__ __forceinline__ uint32_t slot_offset(int slot) const {
    return slot < low_slots
               ? uint32_t(slot) * L::kTileBytes
               : table_offset + kTableBytes + uint32_t(slot - low_slots) * L::kTileBytes;
  }
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

// A tile as one lane sees it, read from its stage in two steps: keys and norms first, value
// words only before the value MMAs (fewer live registers while scores are computed).
struct KeyRegs {
  uint32_t k[L::kKeyWordsPerLane];  // 4 slots x 96 bits of 3-bit key codes
  uint32_t n[4];                    // per slot: (key norm, value norm) fp16
};

__device__ __forceinline__ void read_keys(const char* stage, int lane, KeyRegs& r) {
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const uint4 x = *reinterpret_cast<const uint4*>(stage + 512 * i + 16 * lane);
    r.k[4 * i] = x.x, r.k[4 * i + 1] = x.y, r.k[4 * i + 2] = x.z, r.k[4 * i + 3] = x.w;
  }
  const uint4 x = *reinterpret_cast<const uint4*>(stage + L::kNormOffset + 16 * (lane / 4));
  r.n[0] = x.x, r.n[1] = x.y, r.n[2] = x.z, r.n[3] = x.w;
}

// The 4 value words of 16-token half kb and 16-dim tiles 4*q .. 4*q+3.
__device__ __forceinline__ uint4 read_values(const char* stage, int lane, int kb, int q) {
  return *reinterpret_cast<const uint4*>(stage + L::kValueOffset + 512 * (2 * kb + q) + 16 * lane);
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
                                                const uint32_t (&k)[L::kKeyWordsPerLane], int slot,
                                                int pair) {
  const uint32_t row = key_pair_row(k, 96 * slot + 6 * pair);
  return table_load<kKeyTableOffset>((row & 0x3F00u) | lane_table);
}

// Byte j of the value word becomes address byte 1 (the row); bytes 0, 2, 3 come from
// lane_table.
__device__ __forceinline__ uint32_t value_operand(uint32_t lane_table, uint32_t word, int j) {
  return table_load<0>(__byte_perm(word, lane_table, 0x7604u | (uint32_t(j) << 4)));
}

__device__ __forceinline__ void process_tile(const char* stage, int lane, int tile_token0,
                                             const uint32_t (&qf)[8][2], uint32_t lane_table,
                                             float scale_log2, const BlockCoords& bc, int g,
                                             WarpState& st) {
  KeyRegs r;
  read_keys(stage, lane, r);
  // Scores: four independent MMA chains (m-tile x even/odd k-chunk), summed at the end.
  float s4[2][2][4] = {};
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      mma_16816(s4[mt][kk % 2], key_operand(lane_table, r.k, 2 * mt, 2 * kk),
                key_operand(lane_table, r.k, 2 * mt + 1, 2 * kk),
                key_operand(lane_table, r.k, 2 * mt, 2 * kk + 1),
                key_operand(lane_table, r.k, 2 * mt + 1, 2 * kk + 1), qf[kk][0], qf[kk][1]);
    }
  }
  float s[2][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j) s[mt][j] = s4[mt][0][j] + s4[mt][1][j];
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
    for (int q = 0; q < 2; ++q) {
      const uint4 x = read_values(stage, lane, kb, q);
      const uint32_t words[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w = words[i];
        mma_16816(st.acc[4 * q + i], value_operand(lane_table, w, 0),
                  value_operand(lane_table, w, 1), value_operand(lane_table, w, 2),
                  value_operand(lane_table, w, 3), pb[kb][0], pb[kb][1]);
      }
    }
  }
}

template <int kWarps, int kStages>
__global__ void __launch_bounds__(kWarps * 32, 1)
    tq_attention_kernel(const AttentionArgs a, const TQKernelCodec codec, const uint8_t* tiles,
                        int max_tiles) {
  extern __shared__ __align__(16) char smem[];  // stage slots, operand tables (SmemPlan)
  __shared__ __align__(16) float q_rot[kColumns][kHeadDim];  // rotated query rows

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, c = lane % 4;
  const uint32_t smem_base = smem_addr(smem);
  const SmemPlan plan(smem_base, TQShape<kWarps, kStages>::kStageSlots);
  // Start streaming before the sequence length is known: the first tiles of this split are
  // inside the cache's capacity (allocated), whatever the length turns out to be.
  const int kv_head = blockIdx.y / a.row_groups;
  const uint8_t* seq_tiles =
      tiles + (size_t(blockIdx.z) * a.kv_heads + kv_head) * size_t(max_tiles) * L::kTileBytes +
      16 * lane;
  uint32_t stage[kStages];  // this lane's chunk 0 in each stage; stage[0] is read next
#pragma unroll
  for (int i = 0; i < kStages; ++i) {
    stage[i] = smem_base + plan.slot_offset(kStages * warp + i) + 16 * lane;
  }
  const int first = blockIdx.x * a.tiles_per_split + warp;
  const int prefetch_end = min((blockIdx.x + 1) * a.tiles_per_split, max_tiles);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    const int t = first + i * kWarps;
    if (t < prefetch_end) stage_tile(stage[i], seq_tiles + size_t(t) * L::kTileBytes, lane);
    cp_async_commit();
  }
  const BlockCoords bc = block_coords(a, c);
  if (bc.tile_begin >= bc.tile_end) {  // split past this sequence's end (whole block)
    cp_async_wait<0>();                // no copy may land in shared memory after the block is gone
    return;
  }

  char* tables = smem + plan.table_offset;
  for (int e = warp; e < 256; e += kWarps) {
    char* row = tables + e * kTableRowBytes + 4 * lane;
    *reinterpret_cast<uint32_t*>(row) =
        half2_bits(codec.value_centroids[e % 16], codec.value_centroids[e / 16]);
    if (e < 64) {
      *reinterpret_cast<uint32_t*>(row + kKeyTableOffset) =
          half2_bits(codec.key_centroids[e % 8], codec.key_centroids[e / 8]);
    }
  }
  // R q = H (s ⊙ q) * scale, one warp per query row.
  const uint4 flips = make_uint4(codec.key_sign_flips[0], codec.key_sign_flips[1],
                                 codec.key_sign_flips[2], codec.key_sign_flips[3]);
  load_query_row(a, bc, warp, lane, true, flips, codec.hadamard_scale, q_rot);
  __syncthreads();
  // B operands of the score MMA: k-rows 2c, 2c+1 | 2c+8, 2c+9 of chunk kk are rotated dims
  // 32c + 4kk + {0, 1} | {2, 3} (the key tile layout's pairing), column g.
  uint32_t qf[8][2];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const float4 q = *reinterpret_cast<const float4*>(&q_rot[g][32 * c + 4 * kk]);
    qf[kk][0] = half2_bits(q.x, q.y);
    qf[kk][1] = half2_bits(q.z, q.w);
  }
  const uint32_t lane_table = smem_base + plan.table_offset + 4 * lane;

  WarpState st;
  st.init();
  for (int t = first; t < bc.tile_end; t += kWarps) {
    cp_async_wait<kStages - 2>();  // this tile's group is done; later ones may be in flight
    __syncwarp();
    const char* current = smem + (stage[0] - smem_base) - 16 * lane;
    const int ahead = t + (kStages - 1) * kWarps;
    if (ahead < bc.tile_end) {
      stage_tile(stage[kStages - 1], seq_tiles + size_t(ahead) * L::kTileBytes, lane);
    }
    cp_async_commit();
    process_tile(current, lane, t * kTileTokens, qf, lane_table, a.scale_log2, bc, g, st);
    __syncwarp();  // every lane is done with this stage before it is refilled
    const uint32_t done = stage[0];
#pragma unroll
    for (int i = 0; i + 1 < kStages; ++i) stage[i] = stage[i + 1];
    stage[kStages - 1] = done;
  }
  cp_async_wait<0>();
  write_block_partial<kWarps>(st, reinterpret_cast<float*>(tables), a, bc, warp, g, c);
  finish_row_group<kWarps>(a, bc, warp, lane);
}

template <int kWarps, int kStages>
void launch_shape(const AttentionArgs& args, const TQKernelCodec& codec, const uint8_t* tiles,
                  int max_tiles, int batch, cudaStream_t stream) {
  constexpr int kSmem = TQShape<kWarps, kStages>::kSmemBytes;
  static const bool configured = [] {
    TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(tq_attention_kernel<kWarps, kStages>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    return true;
  }();
  (void)configured;
  const dim3 grid(args.splits, args.kv_heads * args.row_groups, batch);
  tq_attention_kernel<kWarps, kStages>
      <<<grid, kWarps * 32, kSmem, stream>>>(args, codec, tiles, max_tiles);
}

}  // namespace

void launch_tq_attention(const AttentionArgs& args, const TQKernelCodec& codec,
                         const uint8_t* tiles, int max_tiles, int batch, TQBlockShape shape,
                         cudaStream_t stream) {
  if (shape == TQBlockShape::kWide) {
    launch_shape<16, 2>(args, codec, tiles, max_tiles, batch, stream);
  } else {
    launch_shape<12, 3>(args, codec, tiles, max_tiles, batch, stream);
  }
}

}  // namespace turbokv::cuda::attn
