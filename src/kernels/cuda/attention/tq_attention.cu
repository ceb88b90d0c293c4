// Fused TurboQuant 3.5 attention (decode, and prefill over a quantized past) on packed codes
// in the tile format of tq_layout.h. One block of 12 warps per SM; per block: rotate its 8
// query rows once (R q, stored as the score MMA's f16x2 B operands in shared memory), then each
// warp streams its 32-token tiles (w, w + 12, ...) straight from global memory into registers
// (the whole next tile requested before the current one is computed: 9 coalesced 16-B loads
// per lane, no shared-memory staging) and
//  - turns each 6-bit key pair / 8-bit value pair into an f16x2 tensor-core operand with one
//    lane-private shared-memory table lookup (conflict-free: entry e of lane L at
//    256*e + 4L; the address is one funnel shift + LOP3 for keys, one byte_perm for values),
//  - scores = key norm * <R q, c[idx]> (MMA), online softmax in base 2 with a lazy max,
//  - accumulates value norm * p * c[idx] in the rotated frame (MMA).
// Split 0's block of each row group merges the splits and rotates back (merge.cuh).
//
// Why this shape (measured on an H200; docs/kernels.md, "CUDA attention"): shared
// memory stages (cp.async or bulk copies, 12-16 warps, 2-3 stages), deeper register prefetch,
// prefetching in the loop and 14-16 warps were all as fast or slower; the loop costs ~500 warp
// instructions per tile, half of them the operand lookups. Operands from byte_perm lookups in
// registers instead of shared memory, or the shifts as multiplies, were slower (more ALU
// work); keeping the query fragments in shared memory frees the 16 registers that holding the
// next tile's values needs.
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

constexpr int kBlockWarps = 12;  // up to 168 registers per thread (65536 / 384): one block per SM
// Splits of at least kPrefetchFrom tiles prefetch their first kPrefetchTiles tiles to L2 at
// the start (measured: shorter splits only lose by it).
constexpr int kPrefetchFrom = 128;
constexpr int kPrefetchTiles = 36;

// Operand tables, row e (256 B): [value pair e, lanes 0..31][key pair e (e < 64), lanes 0..31].
// They sit at a 64 KB-aligned shared address A, so a lookup address is one LOP3 (keys) or one
// byte_perm (values) of the code word and (A + 4 * lane), with no add. The dynamic buffer is
// large enough to hold a 64 KB-aligned table whatever its base; the block merge reuses it.
constexpr int kTableRowBytes = 256;
constexpr int kTableBytes = 256 * kTableRowBytes;
constexpr int kKeyTableOffset = 128;
constexpr int kSmemBytes = 2 * kTableBytes - 16;
static_assert(kSmemBytes >= block_partial_scratch_bytes(kBlockWarps), "merge scratch fits");

// Fills the tables: every row holds 32 copies (one per lane) of its f16x2 pair, written as
// 8 chunks of 4 copies. Thread (warp w, lane l) writes value rows 16 * hi + l % 16 for
// hi = w, w + 12 (chunks l / 16, + 2, + 4, + 6) and, for w < 8, key rows 8 * w + l % 8
// (chunks l / 8, + 4): a few independent 16-B stores per thread.
__device__ __forceinline__ void fill_tables(char* tables, const TQKernelCodec& codec, int warp,
                                            int lane) {
  const float value_lo = codec.value_centroids[lane % 16];
  for (int hi = warp; hi < 16; hi += kBlockWarps) {
    const uint32_t pair = half2_bits(value_lo, codec.value_centroids[hi]);
    char* row = tables + (16 * hi + lane % 16) * kTableRowBytes;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      *reinterpret_cast<uint4*>(row + 16 * (lane / 16 + 2 * k)) =
          make_uint4(pair, pair, pair, pair);
    }
  }
  if (warp < 8) {
    const uint32_t pair = half2_bits(codec.key_centroids[lane % 8], codec.key_centroids[warp]);
    char* row = tables + (8 * warp + lane % 8) * kTableRowBytes + kKeyTableOffset;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      *reinterpret_cast<uint4*>(row + 16 * (lane / 8 + 4 * k)) = make_uint4(pair, pair, pair, pair);
    }
  }
}

__device__ __forceinline__ const uint8_t* load_nc(const uint8_t* const* p) {
  unsigned long long x;
  asm volatile("ld.global.nc.u64 %0, [%1];" : "=l"(x) : "l"(p));
  return reinterpret_cast<const uint8_t*>(x);
}

// The tiles of the block's sequence and KV head in the paged cache: tile t is tile t % 8 of
// the head's run in block t / 8, [kv_heads][8 tiles][3712 B].
struct SequenceTiles {
  const uint8_t* const* table;  // the sequence's block table row
  size_t head_offset;           // kv_head * 8 * kTileBytes (+ 16 * lane for a lane's chunks)
  __device__ __forceinline__ const uint8_t* tile(int t) const {
    return load_nc(table + t / kBlockTiles) + head_offset + size_t(t % kBlockTiles) * L::kTileBytes;
  }
};

__device__ __forceinline__ SequenceTiles sequence_tiles(const AttentionArgs& a,
                                                        const BlockCoords& bc, size_t extra) {
  return SequenceTiles{a.block_table + size_t(bc.b) * a.table_stride,
                       size_t(bc.kv_head) * kBlockTiles * L::kTileBytes + extra};
}

// Long splits: warp 0 prefetches the split's first kPrefetchTiles tiles to L2 (a tile per
// lane per round), so HBM is busy while the prologue runs and the first steps hit L2
// (measured: from tile 0, not from the second round, is faster).
__device__ __forceinline__ void prefetch_split_start(const AttentionArgs& a,
                                                     const SequenceTiles& seq, int max_tiles,
                                                     int warp, int lane) {
  if (warp != 0 || a.tiles_per_split < kPrefetchFrom) return;
  const int begin = blockIdx.x * a.tiles_per_split;
  const int end = min(min(begin + a.tiles_per_split, max_tiles), begin + kPrefetchTiles);
  for (int t = begin + lane; t < end; t += 32) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(seq.tile(t)),
                 "r"(uint32_t(L::kTileBytes))
                 : "memory");
  }
}

// A tile as one lane holds it: 3 key chunks (12 words = 4 slots x 96 bits of 3-bit codes), the
// lane group's norms (per slot: key norm, value norm as fp16), 4 value chunks.
struct TileRegs {
  uint4 k[3];
  uint4 n;
  uint4 v[4];
};

__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  uint4 x;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
               : "l"(p));
  return x;
}

// Loads issued where they stand (volatile: not moved behind the tile loads).
__device__ __forceinline__ int load_nc(const int* p) {
  int x;
  asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(x) : "l"(p));
  return x;
}
__device__ __forceinline__ float4 load_nc(const float4* p) {
  float4 x;
  asm volatile("ld.global.nc.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
               : "l"(p));
  return x;
}

// tile_lane = tile start + 16 * lane (chunk i of a section at byte 512 * i + 16 * lane).
__device__ __forceinline__ void load_tile_keys(TileRegs& r, const uint8_t* tile_lane, int lane) {
#pragma unroll
  for (int i = 0; i < 3; ++i) r.k[i] = load_stream(tile_lane + 512 * i);
  r.n = load_stream(tile_lane - 16 * lane + L::kNormOffset + 16 * (lane / 4));
}
__device__ __forceinline__ void load_tile_values(TileRegs& r, const uint8_t* tile_lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) r.v[i] = load_stream(tile_lane + L::kValueOffset + 512 * i);
}

// Key code word w (0..11) of the lane's record.
__device__ __forceinline__ uint32_t key_word(const TileRegs& r, int w) {
  const uint4& x = r.k[w / 4];
  return w % 4 == 0 ? x.x : w % 4 == 1 ? x.y : w % 4 == 2 ? x.z : x.w;
}

// The 6-bit key pair at bit `pos` of the lane's record, moved to bits [8, 14) (other bits
// are garbage): its table row. pos is a compile-time constant after unrolling.
__device__ __forceinline__ uint32_t key_pair_row(const TileRegs& r, int pos) {
  constexpr int kWords = L::kKeyWordsPerLane;
  if (pos < 8) return key_word(r, 0) << (8 - pos);
  const int shift = pos - 8, word = shift / 32, bit = shift % 32;
  if (bit + 14 <= 32) return key_word(r, word) >> bit;
  return __funnelshift_r(key_word(r, word), key_word(r, word + 1 < kWords ? word + 1 : word), bit);
}

// lane_table = A + 4 * lane (shared address, A the 64 KB-aligned table base).
template <int kOffset>
__device__ __forceinline__ uint32_t table_load(uint32_t address) {
  uint32_t v;
  asm("ld.shared.u32 %0, [%1+%2];" : "=r"(v) : "r"(address), "n"(kOffset));
  return v;
}

// Key pair `pair` (dims 32c + 2 pair, + 1) of slot `slot`.
__device__ __forceinline__ uint32_t key_operand(uint32_t lane_table, const TileRegs& r, int slot,
                                                int pair) {
  const uint32_t row = key_pair_row(r, 96 * slot + 6 * pair);
  return table_load<kKeyTableOffset>((row & 0x3F00u) | lane_table);
}

// Byte j of the value word becomes address byte 1 (the row); bytes 0, 2, 3 come from
// lane_table.
__device__ __forceinline__ uint32_t value_operand(uint32_t lane_table, uint32_t word, int j) {
  return table_load<0>(__byte_perm(word, lane_table, 0x7604u | (uint32_t(j) << 4)));
}

// The score MMA's B operands (rotated query rows as f16x2), read from shared memory in every
// tile (volatile: not hoisted into 16 registers, which the next tile's values need more).
// frag[kk][lane] at addr + 256 kk: k-rows 2c, 2c+1 | 2c+8, 2c+9 of chunk kk are rotated dims
// 32c + 4kk + {0, 1} | {2, 3} (the key tile layout's pairing), column g.
struct QueryFrags {
  uint32_t addr;  // shared address of frag[0][lane]
  __device__ __forceinline__ void get(int kk, uint32_t& b0, uint32_t& b1) const {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(addr + 256 * kk));
  }
};

__device__ __forceinline__ void process_tile(const TileRegs& r, int tile_token0,
                                             const QueryFrags& qf, uint32_t lane_table,
                                             const BlockCoords& bc, int g, float value_scale,
                                             WarpState& st) {
  // Scores: four independent MMA chains (m-tile x even/odd k-chunk), summed at the end.
  float s4[2][2][4] = {};
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    uint32_t q0, q1;
    qf.get(kk, q0, q1);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      mma_16816(s4[mt][kk % 2], key_operand(lane_table, r, 2 * mt, 2 * kk),
                key_operand(lane_table, r, 2 * mt + 1, 2 * kk),
                key_operand(lane_table, r, 2 * mt, 2 * kk + 1),
                key_operand(lane_table, r, 2 * mt + 1, 2 * kk + 1), q0, q1);
    }
  }
  float s[2][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j) s[mt][j] = s4[mt][0][j] + s4[mt][1][j];
  const uint32_t norm_words[4] = {r.n.x, r.n.y, r.n.z, r.n.w};
  float kmul[4], vmul[4];
#pragma unroll
  for (int slot = 0; slot < 4; ++slot) {
    const __half2 norms = *reinterpret_cast<const __half2*>(&norm_words[slot]);
    kmul[slot] = __low2float(norms);  // the query fragments carry scale * log2 e
    vmul[slot] = __high2float(norms) * value_scale;
  }
  uint32_t pb[2][2];
  softmax_any_tile(st, s, kmul, vmul, tile_token0, bc, g, pb);
  // Values: chunk 2 * kb + q holds the 4 words of 16-token half kb, 16-dim tiles 4q .. 4q+3.
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const uint4 x = r.v[2 * kb + q];
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

// kProgrammatic: launched with PDL (AttentionArgs::programmatic), a separate instantiation so
// that the plain kernel's prologue is exactly the measured one.
template <bool kProgrammatic>
__global__ void __launch_bounds__(kBlockWarps * 32, 1)
    tq_attention_kernel(const AttentionArgs a, const TQKernelCodec codec) {
  extern __shared__ __align__(16) char smem[];   // gap, 64 KB-aligned tables (merge scratch later)
  __shared__ __align__(16) uint2 q_frag[8][32];  // the score MMA's B operands (QueryFrags)
  stamp(a, kStampEntry);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, c = lane % 4;
  const uint32_t smem_base = smem_addr(smem);
  const uint32_t table_offset = (65536u - smem_base % 65536u) % 65536u;
  BlockCoords bc = block_position(a);
  const int max_tiles = a.table_stride * kBlockTiles;
  // Launched with PDL: what reads nothing the previous kernel may write runs before waiting for
  // it (the tables come from the codec argument). The block table may be rewritten by the
  // previous kernels' host-side stream order only, never by a kernel, so the prefetch may read
  // it; an L2 prefetch is only a hint.
  if (kProgrammatic) {
    fill_tables(smem + table_offset, codec, warp, lane);
    prefetch_split_start(a, sequence_tiles(a, bc, 0), max_tiles, warp, lane);
    wait_for_previous_kernel();
  }
  // The query row and the sequence length are requested first (measured: the prologue ends
  // sooner than with them queued behind the tile loads), then the warp's first tile, before
  // the length is known: it is inside the cache's capacity (allocated) whatever the length.
  const int len = load_nc(a.seq_lens + bc.b);
  const float* q_row = warp < kColumns ? query_row(a, bc, warp) : nullptr;
  const float4 q_in = q_row != nullptr ? load_nc(reinterpret_cast<const float4*>(q_row) + lane)
                                       : make_float4(0, 0, 0, 0);
  // Value operands are fp16: norms above kMaxPlainValueNorm are scaled down by a power of two
  // (exact), and the merge scales the output back up.
  const float value_scale = value_operand_scale(a);
  const SequenceTiles seq_tiles = sequence_tiles(a, bc, 16 * lane);
  TileRegs buf[2];
  const int first = blockIdx.x * a.tiles_per_split + warp;
  if (first < min((blockIdx.x + 1) * a.tiles_per_split, max_tiles)) {
    const uint8_t* tile = seq_tiles.tile(first);
    load_tile_keys(buf[0], tile, lane);
    load_tile_values(buf[0], tile);
  }
  if (!kProgrammatic) {
    prefetch_split_start(a, sequence_tiles(a, bc, 0), max_tiles, warp, lane);
    // The tables do not depend on the length: filled while it and the query are on their way
    // (measured: -0.5 to -1%).
    fill_tables(smem + table_offset, codec, warp, lane);
  }
  set_block_limits(a, len, c, bc);
  if (bc.tile_begin >= bc.tile_end) return;  // split past this sequence's end (whole block)
  // R q = H (s ⊙ q) * scale, one warp per query row, written directly as the score MMA's B
  // operands with scale * log2 e folded in (the scores then need only the key norm):
  // frag[kk][4g + c] holds dims 32c + 4kk .. + 3 of row g, and lane l of warp g holds dims
  // 4l .. 4l + 3.
  if (warp < kColumns) {
    const uint4 flips = make_uint4(codec.key_sign_flips[0], codec.key_sign_flips[1],
                                   codec.key_sign_flips[2], codec.key_sign_flips[3]);
    float o[4];
    rotate_row(q_in, lane, flips, o);
    const float scale = codec.hadamard_scale * a.scale_log2;
    q_frag[lane % 8][4 * warp + lane / 8] =
        make_uint2(half2_bits(o[0] * scale, o[1] * scale), half2_bits(o[2] * scale, o[3] * scale));
  }
  __syncthreads();
  stamp(a, kStampPrologue);
  if (a.timeline != nullptr && threadIdx.x == 0) {
    unsigned sm;
    asm("mov.u32 %0, %%smid;" : "=r"(sm));
    stamp(a, kStampSm, sm);
  }
  const QueryFrags qf{smem_addr(&q_frag[0][lane])};
  const uint32_t lane_table = smem_base + table_offset + 4 * lane;

  WarpState st;
  st.init();
  // Unrolled by two so the tile buffers alternate in registers.
  for (int t0 = first; t0 < bc.tile_end; t0 += 2 * kBlockWarps) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int t = t0 + u * kBlockWarps;
      if (t >= bc.tile_end) break;
      // The whole next tile (keys, norms, values) is requested before this one is computed.
      if (t + kBlockWarps < bc.tile_end) {
        const uint8_t* next = seq_tiles.tile(t + kBlockWarps);
        load_tile_keys(buf[1 - u], next, lane);
        load_tile_values(buf[1 - u], next);
      }
      process_tile(buf[u], t * kTileTokens, qf, lane_table, bc, g, value_scale, st);
    }
  }
  stamp(a, kStampLoop);
  let_next_kernel_start();  // a PDL-launched successor may now take SMs as blocks finish
  write_block_partial<kBlockWarps>(st, reinterpret_cast<float*>(smem), a, bc, warp, g, c);
  stamp(a, kStampPartial);
  finish_row_group<kBlockWarps>(a, bc, warp, lane, 1.0f / value_scale);
}

}  // namespace

void launch_tq_attention(const AttentionArgs& args, const TQKernelCodec& codec, int batch,
                         cudaStream_t stream) {
  static const bool configured = [] {
    for (auto kernel : {tq_attention_kernel<false>, tq_attention_kernel<true>}) {
      TURBOKV_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    }
    return true;
  }();
  (void)configured;
  const dim3 grid(args.splits, args.kv_heads * args.row_groups, batch);
  launch_attention_kernel(args.programmatic ? tq_attention_kernel<true> : tq_attention_kernel<false>,
                          grid, kBlockWarps * 32, kSmemBytes, stream, args, codec);
}

}  // namespace turbokv::cuda::attn
