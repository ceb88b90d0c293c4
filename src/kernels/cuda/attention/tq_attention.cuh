// Fused TurboQuant attention (decode, and prefill over a quantized past) on packed codes in the
// tile formats of tq_layout.h, one kernel per (key bits, value bits) pair, instantiated by the
// tq_attention_k*v*.cu files. One block of 12 warps per SM; per block: rotate its 8
// query rows once (R q, stored as the score MMA's f16x2 B operands in shared memory), then each
// warp streams its 32-token tiles (w, w + 12, ...) straight from global memory into registers
// (the whole next tile requested before the current one is computed: 9 coalesced 16-B loads
// per lane, no shared-memory staging) and
//  - turns each key pair / value pair of codes (2 * bits bits) into an f16x2 tensor-core operand
//    with one lane-private shared-memory table lookup (conflict-free: entry e of lane L at
//    256*e + 4L; the address is one byte_perm for 8-bit pairs, else a shift or funnel shift and
//    one LOP3),
//  - scores = key norm * <R q, c[idx]> (MMA), online softmax in base 2 with a lazy max,
//  - accumulates value norm * p * c[idx] in the rotated frame (MMA).
// Split 0's block of each row group merges the splits and rotates back (merge.cuh).
//
// Why this shape (measured on an H200; docs/kernels.md, "CUDA attention"): shared
// memory stages (cp.async or bulk copies, 12-16 warps, 2-3 stages), deeper register prefetch,
// prefetching in the loop and 14-16 warps were all as fast or slower (K3/V4); the loop costs
// ~500 warp instructions per tile, half of them the operand lookups. Operands from byte_perm lookups in
// registers instead of shared memory, or the shifts as multiplies, were slower (more ALU
// work); keeping the query fragments in shared memory frees the 16 registers that holding the
// next tile's values needs.
#pragma once

#include <cuda_fp16.h>

#include "kernels/cuda/attention/async_copy.cuh"
#include "kernels/cuda/attention/kernels.h"
#include "kernels/cuda/attention/merge.cuh"
#include "kernels/cuda/attention/state.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tq_layout.h"

namespace turbokv::cuda::attn {
namespace tq {

constexpr int kBlockWarps = 12;  // up to 168 registers per thread (65536 / 384): one block per SM
// Splits of at least kPrefetchFrom tiles prefetch their first kPrefetchTiles tiles to L2 at
// the start (measured: shorter splits only lose by it).
constexpr int kPrefetchFrom = 128;
constexpr int kPrefetchTiles = 36;

// Operand tables, row e (256 B): [value pair e (e < 2^(2 vb)), lanes 0..31][key pair e
// (e < 2^(2 kb)), lanes 0..31].
// They sit at a 64 KB-aligned shared address A, so a lookup address is one LOP3 (keys) or one
// byte_perm (values) of the code word and (A + 4 * lane), with no add. The dynamic buffer is
// large enough to hold a 64 KB-aligned table whatever its base; the block merge reuses it.
constexpr int kTableRowBytes = 256;
constexpr int kTableBytes = 256 * kTableRowBytes;
constexpr int kKeyTableOffset = 128;
constexpr int kSmemBytes = 2 * kTableBytes - 16;
static_assert(kSmemBytes >= block_partial_scratch_bytes(kBlockWarps), "merge scratch fits");

// Fills the tables: every row holds 32 copies (one per lane) of its f16x2 pair (row
// hi * 2^bits + lo: centroids lo, hi), written as 8 chunks of 4 copies; 8 consecutive threads
// write one row's 128 B (conflict-free 16-B stores).
template <int kKeyBits, int kValueBits>
__device__ __forceinline__ void fill_tables(char* tables, const TQKernelCodec& codec) {
  constexpr int kValueRows = 1 << (2 * kValueBits), kKeyRows = 1 << (2 * kKeyBits);
  constexpr int kThreads = kBlockWarps * 32;
  for (int i = threadIdx.x; i < kValueRows * 8; i += kThreads) {
    const int row = i / 8, chunk = i % 8;
    const uint32_t pair = half2_bits(codec.value_centroids[row & ((1 << kValueBits) - 1)],
                                     codec.value_centroids[row >> kValueBits]);
    *reinterpret_cast<uint4*>(tables + row * kTableRowBytes + 16 * chunk) =
        make_uint4(pair, pair, pair, pair);
  }
  for (int i = threadIdx.x; i < kKeyRows * 8; i += kThreads) {
    const int row = i / 8, chunk = i % 8;
    const uint32_t pair = half2_bits(codec.key_centroids[row & ((1 << kKeyBits) - 1)],
                                     codec.key_centroids[row >> kKeyBits]);
    *reinterpret_cast<uint4*>(tables + row * kTableRowBytes + kKeyTableOffset + 16 * chunk) =
        make_uint4(pair, pair, pair, pair);
  }
}

__device__ __forceinline__ const uint8_t* load_nc(const uint8_t* const* p) {
  unsigned long long x;
  asm volatile("ld.global.nc.u64 %0, [%1];" : "=l"(x) : "l"(p));
  return reinterpret_cast<const uint8_t*>(x);
}

// The tiles of the block's sequence and KV head in the paged cache: tile t is tile t % 8 of
// the head's run in block t / 8, [kv_heads][8 tiles][kTileBytes].
template <int kTileBytes>
struct SequenceTiles {
  const uint8_t* const* table;  // the sequence's block table row
  size_t head_offset;           // kv_head * 8 * kTileBytes (+ 16 * lane for a lane's chunks)
  __device__ __forceinline__ const uint8_t* tile(int t) const {
    return load_nc(table + t / kBlockTiles) + head_offset + size_t(t % kBlockTiles) * kTileBytes;
  }
};

template <int kTileBytes>
__device__ __forceinline__ SequenceTiles<kTileBytes> sequence_tiles(const AttentionArgs& a,
                                                                    const BlockCoords& bc,
                                                                    size_t extra) {
  return SequenceTiles<kTileBytes>{a.block_table + size_t(bc.b) * a.table_stride,
                                   size_t(bc.kv_head) * kBlockTiles * kTileBytes + extra};
}

// Splits of at least min_tiles tiles: warp 0 prefetches the split's first kPrefetchTiles
// tiles to L2 (a tile per lane per round), so HBM is busy while the prologue runs and the
// first steps hit L2 (measured: from tile 0, not from the second round, is faster). A plain
// launch does it for long splits only (kPrefetchFrom; shorter ones lost by it); launched with
// PDL, every split does it while the previous kernel finishes.
template <int kTileBytes>
__device__ __forceinline__ void prefetch_split_start(const AttentionArgs& a,
                                                     const SequenceTiles<kTileBytes>& seq,
                                                     int max_tiles, int warp, int lane,
                                                     int min_tiles) {
  if (warp != 0 || a.tiles_per_split < min_tiles) return;
  const int begin = blockIdx.x * a.tiles_per_split;
  const int end = min(min(begin + a.tiles_per_split, max_tiles), begin + kPrefetchTiles);
  for (int t = begin + lane; t < end; t += 32) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(seq.tile(t)),
                 "r"(uint32_t(kTileBytes))
                 : "memory");
  }
}

// A tile as one lane holds it: kKeyBits key chunks (4 slots x 32 kKeyBits bits), the lane
// group's norms (per slot: key norm, value norm as fp16), kValueBits value chunks.
template <int kKeyBits, int kValueBits>
struct TileRegs {
  static constexpr TQTileLayout kLayout{kKeyBits, kValueBits};
  uint4 k[kKeyBits];
  uint4 n;
  uint4 v[kValueBits];
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
template <int kKeyBits, int kValueBits>
__device__ __forceinline__ void load_tile_keys(TileRegs<kKeyBits, kValueBits>& r,
                                               const uint8_t* tile_lane, int lane) {
#pragma unroll
  for (int i = 0; i < kKeyBits; ++i) r.k[i] = load_stream(tile_lane + 512 * i);
  r.n = load_stream(tile_lane - 16 * lane + r.kLayout.norms_offset() + 16 * (lane / 4));
}
template <int kKeyBits, int kValueBits>
__device__ __forceinline__ void load_tile_values(TileRegs<kKeyBits, kValueBits>& r,
                                                 const uint8_t* tile_lane) {
#pragma unroll
  for (int i = 0; i < kValueBits; ++i) {
    r.v[i] = load_stream(tile_lane + r.kLayout.value_offset() + 512 * i);
  }
}

// Word w of a lane's record of kChunks 16-B chunks.
template <int kChunks>
__device__ __forceinline__ uint32_t record_word(const uint4 (&x)[kChunks], int w) {
  const uint4& c = x[w / 4];
  return w % 4 == 0 ? c.x : w % 4 == 1 ? c.y : w % 4 == 2 ? c.z : c.w;
}

// The pair of kBits-bit codes at bit `pos` of the record, moved to bits [8, 8 + 2 kBits)
// (other bits are garbage): its table row. pos is a compile-time constant after unrolling.
template <int kBits, int kChunks>
__device__ __forceinline__ uint32_t pair_row(const uint4 (&x)[kChunks], int pos) {
  constexpr int kWords = 4 * kChunks;
  if (pos < 8) return record_word(x, 0) << (8 - pos);
  const int shift = pos - 8, word = shift / 32, bit = shift % 32;
  if (bit + 8 + 2 * kBits <= 32) return record_word(x, word) >> bit;
  return __funnelshift_r(record_word(x, word), record_word(x, word + 1 < kWords ? word + 1 : word),
                         bit);
}

// lane_table = A + 4 * lane (shared address, A the 64 KB-aligned table base).
template <int kOffset>
__device__ __forceinline__ uint32_t table_load(uint32_t address) {
  uint32_t v;
  asm("ld.shared.u32 %0, [%1+%2];" : "=r"(v) : "r"(address), "n"(kOffset));
  return v;
}

// The table entry of the code pair at bit `pos` of a record (a lookup at kOffset in the row):
// 8-bit pairs are byte j of their word, which becomes address byte 1 (the row) while bytes
// 0, 2, 3 come from lane_table; narrower pairs are shifted into place and masked.
template <int kBits, int kOffset, int kChunks>
__device__ __forceinline__ uint32_t pair_operand(uint32_t lane_table, const uint4 (&x)[kChunks],
                                                 int pos) {
  if constexpr (kBits == 4) {
    const uint32_t word = record_word(x, pos / 32);
    return table_load<kOffset>(__byte_perm(word, lane_table, 0x7604u | (uint32_t(pos % 32 / 8) << 4)));
  } else {
    constexpr uint32_t kMask = ((1u << (2 * kBits)) - 1) << 8;
    return table_load<kOffset>((pair_row<kBits>(x, pos) & kMask) | lane_table);
  }
}

// Key pair `pair` (dims 32c + 2 pair, + 1) of slot `slot`.
template <int kKeyBits, int kValueBits>
__device__ __forceinline__ uint32_t key_operand(uint32_t lane_table,
                                                const TileRegs<kKeyBits, kValueBits>& r, int slot,
                                                int pair) {
  return pair_operand<kKeyBits, kKeyTableOffset>(lane_table, r.k,
                                                 32 * kKeyBits * slot + 2 * kKeyBits * pair);
}

// Value pair j (A-operand register a_j) of operand group `group` (token half, 16-dim tile).
template <int kKeyBits, int kValueBits>
__device__ __forceinline__ uint32_t value_operand(uint32_t lane_table,
                                                  const TileRegs<kKeyBits, kValueBits>& r,
                                                  int group, int j) {
  return pair_operand<kValueBits, 0>(lane_table, r.v, 8 * kValueBits * group + 2 * kValueBits * j);
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

template <int kKeyBits, int kValueBits>
__device__ __forceinline__ void process_tile(const TileRegs<kKeyBits, kValueBits>& r,
                                             int tile_token0,
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
  // Values: operand group 8 * kt + mt is 16-token half kt, 16-dim tile mt.
#pragma unroll
  for (int kt = 0; kt < 2; ++kt) {
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      const int group = 8 * kt + mt;
      mma_16816(st.acc[mt], value_operand(lane_table, r, group, 0),
                value_operand(lane_table, r, group, 1), value_operand(lane_table, r, group, 2),
                value_operand(lane_table, r, group, 3), pb[kt][0], pb[kt][1]);
    }
  }
}

// kProgrammatic: launched with PDL (AttentionArgs::programmatic), a separate instantiation so
// that the plain kernel's prologue is exactly the measured one.
template <int kKeyBits, int kValueBits, bool kProgrammatic>
__global__ void __launch_bounds__(kBlockWarps * 32, 1)
    tq_attention_kernel(const AttentionArgs a, const TQKernelCodec codec) {
  constexpr int kTileBytes = TQTileLayout{kKeyBits, kValueBits}.tile_bytes();
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
  // previous kernels' host-side stream order only, never by a kernel, so the prefetch and the
  // address of the warp's first tile may read it; an L2 prefetch is only a hint (the tiles'
  // own loads wait: the previous kernel writes the newest token's tile).
  const SequenceTiles<kTileBytes> seq_tiles = sequence_tiles<kTileBytes>(a, bc, 16 * lane);
  const int first = blockIdx.x * a.tiles_per_split + warp;
  const bool has_first = first < min((blockIdx.x + 1) * a.tiles_per_split, max_tiles);
  const uint8_t* first_tile = nullptr;
  if (kProgrammatic) {
    fill_tables<kKeyBits, kValueBits>(smem + table_offset, codec);
    prefetch_split_start(a, sequence_tiles<kTileBytes>(a, bc, 0), max_tiles, warp, lane, 1);
    if (has_first) first_tile = seq_tiles.tile(first);
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
  TileRegs<kKeyBits, kValueBits> buf[2];
  if (has_first) {
    const uint8_t* tile = kProgrammatic ? first_tile : seq_tiles.tile(first);
    load_tile_keys(buf[0], tile, lane);
    load_tile_values(buf[0], tile);
  }
  if (!kProgrammatic) {
    prefetch_split_start(a, sequence_tiles<kTileBytes>(a, bc, 0), max_tiles, warp, lane,
                         kPrefetchFrom);
    // The tables do not depend on the length: filled while it and the query are on their way
    // (measured: -0.5 to -1%).
    fill_tables<kKeyBits, kValueBits>(smem + table_offset, codec);
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

// Launches the kernel of kKeyBits / kValueBits (args.programmatic: its PDL instantiation
// where kPdl is set, else the plain one without the PDL attribute).
template <int kKeyBits, int kValueBits, bool kPdl>
void launch(const AttentionArgs& args, const TQKernelCodec& codec, int batch,
            cudaStream_t stream) {
  static const bool configured = [] {
    TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(tq_attention_kernel<kKeyBits, kValueBits, false>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kSmemBytes));
    if (kPdl) {
      TURBOKV_CUDA_CHECK(cudaFuncSetAttribute(tq_attention_kernel<kKeyBits, kValueBits, kPdl>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              kSmemBytes));
    }
    return true;
  }();
  (void)configured;
  const dim3 grid(args.splits, args.kv_heads * args.row_groups, batch);
  if (args.programmatic && kPdl) {
    launch_attention_kernel(tq_attention_kernel<kKeyBits, kValueBits, kPdl>, grid,
                            kBlockWarps * 32, kSmemBytes, stream, args, codec);
  } else {
    AttentionArgs plain = args;
    plain.programmatic = 0;
    launch_attention_kernel(tq_attention_kernel<kKeyBits, kValueBits, false>, grid,
                            kBlockWarps * 32, kSmemBytes, stream, plain, codec);
  }
}

}  // namespace tq
}  // namespace turbokv::cuda::attn
