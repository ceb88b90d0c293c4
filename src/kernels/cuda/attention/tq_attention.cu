// Fused TurboQuant 3.5 attention (decode, and prefill over a quantized past) on packed codes
// in the tile format of tq_layout.h. Per block: rotate its 8 query rows once (R q), then each
// warp streams 32-token tiles (8 x 16-B loads per lane, next tile prefetched) and
//  - turns each 6-bit key pair / 8-bit value pair into an f16x2 tensor-core operand with one
//    lane-private shared-memory table lookup (conflict-free: entry e of lane L at e*128 + 4L),
//  - scores = key norm * <R q, c[idx]> (MMA), online softmax in base 2,
//  - accumulates value norm * p * c[idx] in the rotated frame (MMA).
// The merge kernel adds the splits and rotates the sum back once (merge.cu).
#include <cuda_fp16.h>

#include "kernels/cuda/attention/kernels.h"
#include "kernels/cuda/attention/state.cuh"
#include "kernels/cuda/tq_layout.h"

namespace turbokv::cuda::attn {
namespace {

using L = TQ35Layout;

struct TileRegs {
  uint32_t k[L::kKeyWordsPerLane];    // 4 slots x 96 bits of 3-bit key codes
  uint32_t v[L::kValueWordsPerLane];  // 16 words of 4-bit value code pairs
  uint32_t n[4];                      // per slot: (key norm, value norm) fp16
};

__device__ __forceinline__ uint4 load_streaming(const uint8_t* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ void load_tile(const uint8_t* tile, int lane, TileRegs& r) {
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const uint4 x = load_streaming(tile + 512 * i + 16 * lane);
    r.k[4 * i] = x.x, r.k[4 * i + 1] = x.y, r.k[4 * i + 2] = x.z, r.k[4 * i + 3] = x.w;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 x = load_streaming(tile + L::kValueOffset + 512 * i + 16 * lane);
    r.v[4 * i] = x.x, r.v[4 * i + 1] = x.y, r.v[4 * i + 2] = x.z, r.v[4 * i + 3] = x.w;
  }
  const uint4 x = load_streaming(tile + L::kNormOffset + 16 * (lane / 4));
  r.n[0] = x.x, r.n[1] = x.y, r.n[2] = x.z, r.n[3] = x.w;
}

// The 6-bit key pair at bit `pos` of the lane's record, moved to bits [7, 13) (other bits
// are garbage): times 128 B = its row in the key table. pos is a constant after unrolling.
__device__ __forceinline__ uint32_t key_pair_row(const uint32_t (&k)[L::kKeyWordsPerLane],
                                                 int pos) {
  if (pos < 7) return k[0] << (7 - pos);
  const int shift = pos - 7, word = shift / 32, bit = shift % 32;
  if (bit + 13 <= 32) return k[word] >> bit;
  return __funnelshift_r(k[word], k[word + 1 < L::kKeyWordsPerLane ? word + 1 : word], bit);
}

__device__ __forceinline__ uint32_t lut_load(const char* lane_table, uint32_t row_offset) {
  return *reinterpret_cast<const uint32_t*>(lane_table + row_offset);
}

__device__ __forceinline__ uint32_t key_operand(const char* k_table,
                                                const uint32_t (&k)[L::kKeyWordsPerLane],
                                                int slot, int pair) {
  return lut_load(k_table, key_pair_row(k, 96 * slot + 6 * pair) & 0x1F80u);
}

__device__ __forceinline__ uint32_t value_operand(const char* v_table, uint32_t word, int j) {
  const uint32_t row = j == 0 ? word << 7 : word >> (8 * j - 7);
  return lut_load(v_table, row & 0x7F80u);
}

__device__ __forceinline__ void process_tile(const TileRegs& r, int tile_token0,
                                             const uint32_t (&qf)[8][2], const char* k_table,
                                             const char* v_table, float scale_log2,
                                             const int (&limit)[2], int g, WarpState& st) {
  float s[2][4] = {};
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      mma_16816(s[mt], key_operand(k_table, r.k, 2 * mt, 2 * kk),
                key_operand(k_table, r.k, 2 * mt + 1, 2 * kk),
                key_operand(k_table, r.k, 2 * mt, 2 * kk + 1),
                key_operand(k_table, r.k, 2 * mt + 1, 2 * kk + 1), qf[kk][0], qf[kk][1]);
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
  softmax_tile(st, s, kmul, vmul, tile_token0, limit, g, pb);
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) {
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      const uint32_t w = r.v[8 * kb + mt];
      mma_16816(st.acc[mt], value_operand(v_table, w, 0), value_operand(v_table, w, 1),
                value_operand(v_table, w, 2), value_operand(v_table, w, 3), pb[kb][0],
                pb[kb][1]);
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32)
    tq_attention_kernel(const AttentionArgs a, const TQKernelCodec codec, const uint8_t* tiles,
                        int max_tiles) {
  // Lane-private operand tables: [entry][lane] f16x2 (c[lo code], c[hi code]).
  __shared__ __align__(16) uint32_t k_table[64 * 32];   // key pairs, 8 KB
  __shared__ __align__(16) uint32_t v_table[256 * 32];  // value pairs, 32 KB (reused at the end)
  __shared__ float q_rot[kColumns][kHeadDim];           // rotated query rows

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, c = lane % 4;
  const BlockCoords bc = block_coords(a, c);
  if (bc.tile_begin >= bc.tile_end) return;  // split past this sequence's end (whole block)

  for (int e = warp; e < 64; e += kWarps)
    k_table[e * 32 + lane] = half2_bits(codec.key_centroids[e % 8], codec.key_centroids[e / 8]);
  for (int e = warp; e < 256; e += kWarps) {
    v_table[e * 32 + lane] =
        half2_bits(codec.value_centroids[e % 16], codec.value_centroids[e / 16]);
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
  const char* k_lane = reinterpret_cast<const char*>(k_table) + 4 * lane;
  const char* v_lane = reinterpret_cast<const char*>(v_table) + 4 * lane;

  WarpState st;
  st.init();
  const uint8_t* seq_tiles =
      tiles + (size_t(bc.b) * a.kv_heads + bc.kv_head) * size_t(max_tiles) * L::kTileBytes;
  TileRegs buf[2];
  int t = bc.tile_begin + warp;
  if (t < bc.tile_end) load_tile(seq_tiles + size_t(t) * L::kTileBytes, lane, buf[0]);
  for (; t < bc.tile_end; t += 2 * kWarps) {
    const int t1 = t + kWarps;
    if (t1 < bc.tile_end) load_tile(seq_tiles + size_t(t1) * L::kTileBytes, lane, buf[1]);
    process_tile(buf[0], t * kTileTokens, qf, k_lane, v_lane, a.scale_log2, bc.limit, g, st);
    if (t1 >= bc.tile_end) break;
    const int t2 = t1 + kWarps;
    if (t2 < bc.tile_end) load_tile(seq_tiles + size_t(t2) * L::kTileBytes, lane, buf[0]);
    process_tile(buf[1], t1 * kTileTokens, qf, k_lane, v_lane, a.scale_log2, bc.limit, g, st);
  }
  static_assert(sizeof(v_table) >= sizeof(float) * kWarps * (kColumns * kHeadDim + 2 * kColumns),
                "merge scratch fits in the value table");
  write_block_partial(st, reinterpret_cast<float*>(v_table), a, bc, warp, g, c);
}

}  // namespace

void launch_tq_attention(const AttentionArgs& args, const TQKernelCodec& codec,
                         const uint8_t* tiles, int max_tiles, int batch, cudaStream_t stream) {
  const dim3 grid(args.splits, args.kv_heads * args.row_groups, batch);
  tq_attention_kernel<<<grid, kWarps * 32, 0, stream>>>(args, codec, tiles, max_tiles);
}

int tq_attention_blocks_per_sm() {
  int blocks = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, tq_attention_kernel, kWarps * 32, 0);
  return blocks > 0 ? blocks : 1;
}

}  // namespace turbokv::cuda::attn
