// Quantize kernel: one warp per (token, kv head, role) vector of 128 floats; lane l holds
// elements 4l .. 4l+3. Every float operation is an explicit round-to-nearest intrinsic in the
// order documented in quant/codec_mse.h (and this file is built with -fmad=false), so codes
// and fp16 norms equal the CPU reference bit for bit.
#include <cuda_fp16.h>

#include "core/error.h"
#include "kernels/cuda/codec_ops.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/tq_layout.h"
#include "kernels/cuda/tq_quantize.h"

namespace turbokv::cuda {
namespace {

using L = TQTileLayout;
constexpr int kWarpsPerBlock = 4;

// Σ v_i² in the order of quant/codec_mse.h. scratch: this warp's [128] floats.
__device__ float sum_squares(const float (&v)[4], float* scratch, int lane) {
  for (int j = 0; j < 4; ++j) scratch[4 * lane + j] = __fmul_rn(v[j], v[j]);
  __syncwarp();
  return ordered_sum(scratch, L::kHeadDim, lane);
}

// Σ a_i b_i over the 128 dims (dim 4 lane + j in a[j], b[j]), in the same order.
__device__ float sum_products(const float (&a)[4], const float (&b)[4], float* scratch, int lane) {
  for (int j = 0; j < 4; ++j) scratch[4 * lane + j] = __fmul_rn(a[j], b[j]);
  __syncwarp();
  return ordered_sum(scratch, L::kHeadDim, lane);
}

// What a vector's quantization needs that depends only on host data (rows, block tables,
// sequence states: uploaded before a step) and on the codec argument, so kernels launched with
// PDL look it up before waiting for the previous kernel:
//  - its tile (block row_pos / 256 of the row's sequence, tile (head, pos % 256 / 32)) and its
//    token in the tile;
//  - its sequence's mean for centering (the pointer; the fp16 values are read after the wait);
//  - the lane's sign-flip word (dims 4l .. 4l+3 lie in word l / 8) and centroid `lane % levels`,
//    which the codes then take by a shuffle instead of a lane-divergent parameter load.
struct VectorSetup {
  uint8_t* tile = nullptr;
  int tok = 0;
  const __half* mean = nullptr;  // this head's 128 means, or null
  uint32_t flips = 0;
  float centroid = 0;
};
__device__ __forceinline__ VectorSetup vector_setup(const TQKernelCodec& codec,
                                                    const TQQuantizeProblem& p, int64_t row,
                                                    int head, int role, int lane) {
  const int token = p.row_pos[row];
  const int seq = p.row_seq[row];
  uint8_t* block = p.block_table[size_t(seq) * p.table_stride + token / (32 * kTilesPerBlock)];
  const TQTileLayout lay{codec.key_bits, codec.value_bits};
  VectorSetup s;
  s.tile =
      block + (size_t(head) * kTilesPerBlock + (token % (32 * kTilesPerBlock)) / L::kTileTokens) *
                  size_t(lay.tile_bytes());
  s.tok = token % L::kTileTokens;
  if (p.states != nullptr) {
    const TQSequenceState& st = p.states[seq];
    const __half* mean = role == 0 ? st.key_mean : st.value_mean;
    if (mean != nullptr) s.mean = mean + head * L::kHeadDim;
  }
  s.flips = (role == 0 ? codec.key_sign_flips : codec.value_sign_flips)[lane / 8];
  const int levels = 1 << (role == 0 ? lay.key_bits : lay.value_bits);
  s.centroid = (role == 0 ? codec.key_centroids : codec.value_centroids)[lane % levels];
  return s;
}

// Quantizes one vector (lane l holds elements 4l .. 4l+3), role 0 (key) or 1 (value), into
// its tile (vector_setup). Warp-collective; scratch: this warp's [128] floats.
__device__ void quantize_vector(const TQKernelCodec& codec, const TQQuantizeProblem& p,
                                const float (&x_in)[4], int role, const VectorSetup& setup,
                                float* scratch, int lane) {
  float x[4] = {x_in[0], x_in[1], x_in[2], x_in[3]};
  if (setup.mean != nullptr) {  // centering: x - float(mean)
    for (int j = 0; j < 4; ++j) {
      x[j] = __fsub_rn(x[j], __half2float(setup.mean[4 * lane + j]));
    }
  }

  // 1-2. norm and unit vector
  const float n = __fsqrt_rn(sum_squares(x, scratch, lane));
  const float inv = __fdiv_rn(1.0f, fmaxf(n, 1e-6f));
  float z[4];
  for (int j = 0; j < 4; ++j) {
    const float u = __fmul_rn(x[j], inv);
    z[j] = (setup.flips >> ((4 * lane + j) % 32)) & 1u ? -u : u;
  }
  // 3. butterflies h = 1, 2 inside the lane, h = 4 .. 64 across lanes (lane ^ h/4)
  for (int h = 1; h <= 2; h *= 2) {
    for (int j = 0; j < 4; ++j) {
      if (j & h) continue;
      const float a = z[j], c = z[j + h];
      z[j] = __fadd_rn(a, c);
      z[j + h] = __fsub_rn(a, c);
    }
  }
  for (int h = 4; h < L::kHeadDim; h *= 2) {
    const bool upper = lane & (h / 4);
    for (int j = 0; j < 4; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, z[j], h / 4);
      z[j] = upper ? __fsub_rn(other, z[j]) : __fadd_rn(z[j], other);
    }
  }
  // 4. codes: #{k : boundary[k] < y}
  const TQTileLayout lay{codec.key_bits, codec.value_bits};
  const int bits_per_code = role == 0 ? lay.key_bits : lay.value_bits;
  const int levels = 1 << bits_per_code;
  const float* boundaries = role == 0 ? codec.key_boundaries : codec.value_boundaries;
  uint32_t code[4];
  float chat[4], ys[4];
  for (int j = 0; j < 4; ++j) {
    const float y = __fmul_rn(z[j], codec.hadamard_scale);
    ys[j] = y;
    uint32_t idx = 0;
    for (int k = 0; k < levels - 1; ++k) idx += boundaries[k] < y ? 1u : 0u;
    code[j] = idx;
    chat[j] = __shfl_sync(0xffffffffu, setup.centroid, int(idx));  // centroids[idx]
  }
  // 5. unbiased norm (n / <y, c[idx]>) or norm correction (n / |c[idx]|)
  float stored = n;
  if (codec.norm_correction == 2) {
    const float p = sum_products(ys, chat, scratch, lane);
    if (p > 0) stored = __fdiv_rn(n, p);
  } else if (codec.norm_correction) {
    const float cn = __fsqrt_rn(sum_squares(chat, scratch, lane));
    if (cn > 0) stored = __fdiv_rn(n, cn);
  }

  // 6. pack into the tile
  uint8_t* tile = setup.tile;
  const int tok = setup.tok;
  if (role == 0) {
    // The token's key is one whole slot of key_bits words in its lane (dims 32c .. 32c + 31 of
    // quarter c = lane / 8): lane l's 4 key_bits bits land at bit 4 key_bits (l % 8) of the
    // slot; OR over the 8 lanes of the quarter, then its first lane writes the words.
    const int kb = lay.key_bits;
    const uint32_t bits = code[0] | code[1] << kb | code[2] << (2 * kb) | code[3] << (3 * kb);
    const int offset = 4 * kb * (lane % 8);
    uint32_t words[L::kMaxBits] = {0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < L::kMaxBits; ++w) {
      if (w == offset / 32) words[w] = bits << (offset % 32);
      if (w == offset / 32 + 1 && offset % 32 + 4 * kb > 32) {
        words[w] = bits >> (32 - offset % 32);
      }
    }
#pragma unroll
    for (int w = 0; w < L::kMaxBits; ++w) {
      for (int m = 1; m < 8; m *= 2) words[w] |= __shfl_xor_sync(0xffffffffu, words[w], m);
    }
    if (lane % 8 == 0) {
      const int dim0 = 4 * lane;
      const int key_lane = L::key_lane(tok, dim0);
      const int first_word = lay.key_bit(tok, dim0) / 32;
#pragma unroll
      for (int w = 0; w < L::kMaxBits; ++w) {
        if (w >= kb) break;
        *reinterpret_cast<uint32_t*>(tile + L::lane_word_offset(0, key_lane, first_word + w)) =
            words[w];
      }
    }
  } else {
    // Values share words with other tokens (and may straddle two words): clear and set only
    // the code's own bits.
    const int vb = lay.value_bits;
    const uint32_t mask = (1u << vb) - 1;
    for (int j = 0; j < 4; ++j) {
      const int d = 4 * lane + j;
      const int lane_of = L::value_lane(tok, d);
      const int bit = lay.value_bit(tok, d), shift = bit % 32;
      uint32_t* word = reinterpret_cast<uint32_t*>(
          tile + L::lane_word_offset(lay.value_offset(), lane_of, bit / 32));
      atomicAnd(word, ~(mask << shift));
      atomicOr(word, code[j] << shift);
      if (shift + vb > 32) {
        uint32_t* next = reinterpret_cast<uint32_t*>(
            tile + L::lane_word_offset(lay.value_offset(), lane_of, bit / 32 + 1));
        atomicAnd(next, ~(mask >> (32 - shift)));
        atomicOr(next, code[j] >> (32 - shift));
      }
    }
  }
  if (lane == 0) {
    const uint16_t bits = to_f16_bits(stored);
    *reinterpret_cast<uint16_t*>(tile + lay.norm_offset(tok, role)) = bits;
    if (role == 1 && p.value_norm_max != nullptr) {
      atomicMax(p.value_norm_max, __float_as_uint(fabsf(__half2float(__ushort_as_half(bits)))));
    }
  }
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    tq_quantize_kernel(const TQKernelCodec codec, const TQQuantizeProblem p) {
  __shared__ float scratch[kWarpsPerBlock][L::kHeadDim];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t vec = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  const int64_t total = int64_t(p.rows) * p.kv_heads * 2;
  const int role = int(vec % 2);  // 0 key, 1 value
  const int64_t rest = vec / 2;
  const int head = int(rest % p.kv_heads);
  const int64_t row = rest / p.kv_heads;
  const VectorSetup setup =
      vec < total ? vector_setup(codec, p, row, head, role, lane) : VectorSetup{};
  pdl_wait();  // launched with PDL (launch.h); the setup is host data (vector_setup)
  pdl_release();
  if (vec >= total) return;
  const float* src = (role == 0 ? p.k : p.v) + (row * p.kv_heads + head) * L::kHeadDim;
  const float4 x4 = reinterpret_cast<const float4*>(src)[lane];
  const float x[4] = {x4.x, x4.y, x4.z, x4.w};
  quantize_vector(codec, p, x, role, setup, scratch[warp], lane);
}

// One warp per (row, head slot): slots [0, heads) are query heads (written to q), then the KV
// heads' keys, then their values (quantized). qkv_post's bias and RoPE (rope.cuh), in lanes:
// element d of a rotated pair sits in lane d / 4, its partner rotary_dim / 8 lanes away.
// Blocks of kRopeWarps warps. The next kernel (the fused attention) is released right after
// the wait, so it fills its tables and prefetches its first tiles while this one computes: a
// decode step's few blocks of this kernel leave the SMs the attention grid needs (measured on
// an H100, attn4 at batch 1, 32k: +1-1.5% per step over releasing at the end).
constexpr int kRopeWarps = 16;
__global__ void __launch_bounds__(kRopeWarps * 32)
    tq_rope_quantize_kernel(const TQKernelCodec codec, const TQRopeQuantizeProblem p) {
  __shared__ float scratch[kRopeWarps][L::kHeadDim];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kv_heads = p.cache.kv_heads;
  const int slots = p.heads + 2 * kv_heads;
  const int64_t vec = int64_t(blockIdx.x) * kRopeWarps + warp;
  const bool valid = vec < int64_t(p.cache.rows) * slots;
  const int slot = int(vec % slots);
  const int64_t row = vec / slots;
  const bool rotates = valid && slot < p.heads + kv_heads && p.rotary_dim > 0;
  // Before waiting for the previous kernel (launched with PDL, launch.h), what depends only on
  // host data (positions, inv_freq, rows, block tables, sequence states) or on weights: the
  // rotation's cos and sin of pair i (< half), computed once, by lane i % 32 (its k = i / 32),
  // and shuffled below to the two lanes that rotate with them; a key's or value's
  // vector_setup; the bias.
  float cs[2][2] = {{0, 0}, {0, 0}};
  if (rotates) {
    const int half = p.rotary_dim / 2;  // <= 64
    const float position = float(p.positions[row]);
    for (int k = 0; k < 2; ++k) {
      const int i = lane + 32 * k;
      if (i < half)
        rope_cos_sin(position, p.inv_freq[i], p.attention_scaling, &cs[k][0], &cs[k][1]);
    }
  }
  const int kv = slot - p.heads;
  const VectorSetup setup =
      valid && kv >= 0 ? vector_setup(codec, p.cache, row, kv % kv_heads, kv / kv_heads, lane)
                       : VectorSetup{};
  const int col = slot * L::kHeadDim + 4 * lane;
  float bias[4] = {0, 0, 0, 0};  // a weight: no kernel writes it
  if (valid && p.bias != nullptr) {
    for (int j = 0; j < 4; ++j) bias[j] = p.bias[col + j];
  }
  pdl_wait();
  pdl_release();
  if (!valid) return;
  const int width = (p.heads + 2 * kv_heads) * L::kHeadDim;
  const float4 x4 = *reinterpret_cast<const float4*>(p.qkv + row * width + col);
  float x[4] = {x4.x, x4.y, x4.z, x4.w};
  for (int j = 0; j < 4; ++j) x[j] = __fadd_rn(x[j], bias[j]);
  if (rotates) {
    const int half = p.rotary_dim / 2;
    const bool low = 4 * lane < half, rotated = 4 * lane < p.rotary_dim;
    const int partner = low ? lane + half / 4 : rotated ? lane - half / 4 : lane;
    for (int j = 0; j < 4; ++j) {
      const float other = __shfl_sync(0xffffffffu, x[j], partner);
      const int d = 4 * lane + j, i = rotated ? (low ? d : d - half) : 0;
      const int from = i % 32;
      const float c0 = __shfl_sync(0xffffffffu, cs[0][0], from);
      const float s0 = __shfl_sync(0xffffffffu, cs[0][1], from);
      const float c1 = __shfl_sync(0xffffffffu, cs[1][0], from);
      const float s1 = __shfl_sync(0xffffffffu, cs[1][1], from);
      if (!rotated) continue;
      const float c = i < 32 ? c0 : c1, sn = i < 32 ? s0 : s1;
      float ra, rb;
      if (low) {
        rope_rotate(x[j], other, c, sn, &ra, &rb);
        x[j] = ra;
      } else {
        rope_rotate(other, x[j], c, sn, &ra, &rb);
        x[j] = rb;
      }
    }
  }
  if (slot < p.heads) {
    *reinterpret_cast<float4*>(p.q + (row * p.heads + slot) * L::kHeadDim + 4 * lane) =
        make_float4(x[0], x[1], x[2], x[3]);
    return;
  }
  quantize_vector(codec, p.cache, x, kv / kv_heads, setup, scratch[warp], lane);
}

}  // namespace

bool tq_rope_quantize_supported(int rotary_dim) {
  return rotary_dim >= 0 && rotary_dim <= L::kHeadDim && rotary_dim % 8 == 0;
}

void tq_rope_quantize(const TQKernelCodec& codec, const TQRopeQuantizeProblem& problem,
                      cudaStream_t stream) {
  const TQQuantizeProblem& c = problem.cache;
  if (c.rows < 1 || c.kv_heads < 1 || c.table_stride < 1 || problem.heads < 1 ||
      problem.qkv == nullptr || problem.q == nullptr || problem.positions == nullptr ||
      !tq_rope_quantize_supported(problem.rotary_dim) ||
      (problem.rotary_dim > 0 && problem.inv_freq == nullptr)) {
    throw InvalidArgument(str_cat("tq_rope_quantize: rows ", c.rows, ", heads ", problem.heads,
                                  ", kv_heads ", c.kv_heads, ", table_stride ", c.table_stride,
                                  ", rotary_dim ", problem.rotary_dim,
                                  ": need positive shapes, qkv, q, positions (inv_freq when "
                                  "rotating) and a rotary_dim that is a multiple of 8 <= 128"));
  }
  if (!TQTileLayout::supported(codec.key_bits, codec.value_bits)) {
    throw InvalidArgument(str_cat("tq_rope_quantize: K", codec.key_bits, "/V", codec.value_bits,
                                  " has no tile format (key and value bits 2..4)"));
  }
  const int64_t vectors = int64_t(c.rows) * (problem.heads + 2 * c.kv_heads);
  const int64_t blocks = (vectors + kRopeWarps - 1) / kRopeWarps;
  launch_pdl(tq_rope_quantize_kernel, dim3(unsigned(blocks)), dim3(kRopeWarps * 32), 0, stream,
             codec, problem);
}

void tq_quantize(const TQKernelCodec& codec, const TQQuantizeProblem& problem,
                 cudaStream_t stream) {
  if (problem.rows < 1 || problem.kv_heads < 1 || problem.table_stride < 1) {
    throw InvalidArgument(str_cat("tq_quantize: rows ", problem.rows, ", kv_heads ",
                                  problem.kv_heads, ", table_stride ", problem.table_stride,
                                  ": all must be >= 1"));
  }
  if (!TQTileLayout::supported(codec.key_bits, codec.value_bits)) {
    throw InvalidArgument(str_cat("tq_quantize: K", codec.key_bits, "/V", codec.value_bits,
                                  " has no tile format (key and value bits 2..4)"));
  }
  const int64_t vectors = int64_t(problem.rows) * problem.kv_heads * 2;
  const int64_t blocks = (vectors + kWarpsPerBlock - 1) / kWarpsPerBlock;
  launch_pdl(tq_quantize_kernel, dim3(unsigned(blocks)), dim3(kWarpsPerBlock * 32), 0, stream,
             codec, problem);
}

}  // namespace turbokv::cuda
