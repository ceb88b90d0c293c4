// Writers of the paged KV blocks: one warp per (row, KV head, K or V) vector. Each writes its
// vector's bytes only (codes and norms / params, or elements), so the appends of different
// tokens sharing a block, byte or word never race. TurboQuant and uniform codes follow the
// CPU codecs' operation order step by step (quant/codec_mse.h, quant/rotation.h,
// quant/codec_uniform.h) with explicit round-to-nearest intrinsics; this file is built with
// -fmad=false, so codes and fp16 norms / params equal the CPU's bit for bit.
#include <cuda_fp16.h>

#include "core/error.h"
#include "kernels/cuda/codec_ops.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kvcache/frame.cuh"
#include "kernels/cuda/kvcache/launch.cuh"
#include "kernels/cuda/kvcache/plan.h"

namespace turbokv::cuda {
namespace paged {
namespace {

constexpr int kAppendWarps = 4;

// Where vector (row, role) goes: its block and token, or nullptr for a skipped row.
struct Target {
  uint8_t* block = nullptr;
  size_t row = 0;  // kv_head * kBlockTokens + token: the vector's row in each section
  int seq = 0;
  int pos = 0;
};

struct VectorId {
  int row, head, role;  // role 0: key, 1: value
};

// Warp w of block i takes vector 4 i + w; vectors run (row, head, role) with role fastest.
__device__ __forceinline__ bool vector_id(int64_t vec, const AppendRows& rows, int kv_heads,
                                          VectorId* id) {
  if (vec >= int64_t(rows.rows) * kv_heads * 2) return false;
  id->role = int(vec % 2);
  id->head = int((vec / 2) % kv_heads);
  id->row = int(vec / (2 * int64_t(kv_heads)));
  return true;
}

__device__ __forceinline__ Target find_target(const PagedBatch& b, const AppendRows& rows,
                                              const VectorId& id) {
  Target t;
  const int seq = rows.row_seq[id.row];
  const int pos = rows.row_pos[id.row];
  if (seq < 0 || seq >= b.batch || pos < 0 ||
      int64_t(pos) >= int64_t(b.table_stride) * kBlockTokens) {
    return t;
  }
  t.block = const_cast<uint8_t*>(b.block_table[size_t(seq) * b.table_stride + pos / kBlockTokens]);
  t.row = size_t(id.head) * kBlockTokens + pos % kBlockTokens;
  t.seq = seq;
  t.pos = pos;
  return t;
}

// This warp's vector: which one, where it goes and its input row (false: nothing to write).
struct Job {
  VectorId id;
  Target target;
  const float* src;  // [head_dim]
};
__device__ __forceinline__ bool warp_job(const PagedBatch& b, const AppendRows& rows, int kv_heads,
                                         int head_dim, Job* job) {
  const int64_t vec = int64_t(blockIdx.x) * kAppendWarps + threadIdx.x / 32;
  if (!vector_id(vec, rows, kv_heads, &job->id)) return false;
  job->target = find_target(b, rows, job->id);
  job->src = (job->id.role == 0 ? rows.k : rows.v) +
             (size_t(job->id.row) * kv_heads + job->id.head) * head_dim;
  return job->target.block != nullptr;
}

// Per-warp shared scratch of one vector.
struct VectorScratch {
  float x[kMaxHeadDim];  // the (centered) input vector
  float a[kMaxHeadDim];
  float y[kMaxHeadDim];
  uint8_t code[kMaxHeadDim];
};

// codes[0, ceil(n * bits / 8)) = code[0, n) packed LSB-first (quant/bitpack.h): byte k holds
// bits [8k, 8k + 8) of the codes' bit string; the last byte's unused bits are 0.
__device__ __forceinline__ void pack_codes(const uint8_t* code, int n, int bits, uint8_t* out,
                                           int lane) {
  const int bytes = (n * bits + 7) / 8;
  for (int k = lane; k < bytes; k += 32) {
    const int first = 8 * k / bits;
    const int last = min(n - 1, (8 * k + 7) / bits);
    uint32_t byte = 0;
    for (int i = first; i <= last; ++i) {
      const int shift = i * bits - 8 * k;
      byte |= shift >= 0 ? uint32_t(code[i]) << shift : uint32_t(code[i]) >> -shift;
    }
    out[k] = uint8_t(byte);
  }
}

// One MSE segment of the vector in w.x [head_dim] (quant/codec_mse.h steps 1-6): codes to
// `codes`, the fp16 norm to `norm`. order: the sequence's channel order (nullable).
__device__ void quantize_segment(const TQSegment& seg, const int* order, int head, int head_dim,
                                 VectorScratch& w, uint8_t* codes, uint16_t* norm, int lane) {
  const int n = seg.dim;
  // 1. the segment's channels and their squares; n = sqrt(Σ in 8 partial sums)
  for (int i = lane; i < n; i += 32) {
    const float u = w.x[segment_channel(seg, order, head, head_dim, i)];
    w.a[i] = u;
    w.y[i] = __fmul_rn(u, u);
  }
  __syncwarp();
  const float length = __fsqrt_rn(ordered_sum(w.y, n, lane));
  // 2-3. u = x / max(n, 1e-6) by one reciprocal, then y = R u (rotation.h order)
  const float inv = __fdiv_rn(1.0f, fmaxf(length, 1e-6f));
  if (seg.hadamard) {
    for (int i = lane; i < n; i += 32) {
      const float u = __fmul_rn(w.a[i], inv);
      w.a[i] = sign_flip_at(seg.sign_words, i) ? -u : u;
    }
    __syncwarp();
    fwht_warp(w.a, n, lane);
    for (int i = lane; i < n; i += 32) w.y[i] = __fmul_rn(w.a[i], seg.hadamard_scale);
  } else {
    for (int i = lane; i < n; i += 32) w.a[i] = __fmul_rn(w.a[i], inv);
    __syncwarp();
    for (int i = lane; i < n; i += 32) {
      float acc = 0.0f;  // y_i = (((0 + R[i][0] u_0) + R[i][1] u_1) + ...), R[i][j] = R^T[j][i]
      for (int j = 0; j < n; ++j)
        acc = __fadd_rn(acc, __fmul_rn(seg.rotation_t[j * n + i], w.a[j]));
      w.y[i] = acc;
    }
  }
  __syncwarp();
  // 4. code = #{k : B[k] < y} (binary search as codebook.h's nearest_centroid; NaN -> 0), and
  // the centroids' squares (unbiased norm: y * centroid) for step 5
  for (int i = lane; i < n; i += 32) {
    const float y = w.y[i];
    int lo = 0, hi = (1 << seg.bits) - 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (seg.boundaries[mid] < y) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    w.code[i] = uint8_t(lo);
    const float c = seg.centroids[lo];
    w.a[i] = seg.norm_correction == 2 ? __fmul_rn(y, c) : __fmul_rn(c, c);
  }
  __syncwarp();
  // 5. unbiased norm: stored = n / <y, c[idx]>; norm correction: n / |c[idx]| (same sum order)
  float stored = length;
  if (seg.norm_correction == 2) {
    const float p = ordered_sum(w.a, n, lane);
    if (p > 0) stored = __fdiv_rn(length, p);
  } else if (seg.norm_correction) {
    const float cn = __fsqrt_rn(ordered_sum(w.a, n, lane));
    if (cn > 0) stored = __fdiv_rn(length, cn);
  }
  if (lane == 0) *norm = to_f16_bits(stored);
  // 6. pack
  pack_codes(w.code, n, seg.bits, codes, lane);
  __syncwarp();  // the scratch is free for the next segment
}

// w.x [head_dim] = the vector, minus float(mean) where the format centers it.
__device__ __forceinline__ void load_vector(const float* src, const __half* mean, int head,
                                            int head_dim, float* x, int lane) {
  for (int i = lane; i < head_dim; i += 32) {
    const float v = src[i];
    x[i] = mean != nullptr ? __fsub_rn(v, __half2float(mean[head * head_dim + i])) : v;
  }
  __syncwarp();
}

__global__ void __launch_bounds__(kAppendWarps * 32)
    tq_append_kernel(const TQFormat f, const PagedBatch b, const TQSequenceState* states,
                     const AppendRows rows, const BlockGeometry g) {
  __shared__ VectorScratch scratch[kAppendWarps];
  const int lane = threadIdx.x % 32;
  Job job;
  if (!warp_job(b, rows, f.kv_heads, f.head_dim, &job)) return;
  const VectorId& id = job.id;
  const Target& t = job.target;
  const TQTensorFormat& tf = id.role == 0 ? f.key : f.value;
  const TQSequenceState state = states != nullptr ? states[t.seq] : TQSequenceState{};
  const int* order = id.role == 0 ? state.key_order : state.value_order;
  if (t.pos < f.sink_tokens) {  // an uncoded sink row: fp16 as it comes
    __half* sink = (id.role == 0 ? state.sink_keys : state.sink_values) +
                   (size_t(id.head) * f.sink_tokens + t.pos) * f.head_dim;
    for (int i = lane; i < f.head_dim; i += 32) {
      sink[i] = __ushort_as_half(to_f16_bits(job.src[i]));
    }
    return;
  }
  VectorScratch& w = scratch[threadIdx.x / 32];
  load_vector(job.src, id.role == 0 ? state.key_mean : state.value_mean, id.head, f.head_dim, w.x,
              lane);
  uint8_t* codes = t.block + (id.role == 0 ? g.k_offset : g.v_offset) + t.row * tf.code_bytes;
  uint16_t* norms =
      reinterpret_cast<uint16_t*>(t.block + (id.role == 0 ? g.k_aux_offset : g.v_aux_offset)) +
      t.row * tf.norms_per_vector;
  for (int s = 0; s < tf.segments; ++s) {
    quantize_segment(tf.seg[s], order, id.head, f.head_dim, w, codes + tf.seg[s].code_offset,
                     norms + tf.seg[s].norm_index, lane);
  }
}

// w.x [head_dim] = R w.x by a one-segment rotation (quant/rotation.h's apply, bit for bit);
// w.a is scratch.
__device__ void rotate_vector(const TQSegment& r, VectorScratch& w, int lane) {
  const int n = r.dim;
  if (r.hadamard) {
    for (int i = lane; i < n; i += 32) w.a[i] = sign_flip_at(r.sign_words, i) ? -w.x[i] : w.x[i];
    __syncwarp();
    fwht_warp(w.a, n, lane);
    for (int i = lane; i < n; i += 32) w.x[i] = __fmul_rn(w.a[i], r.hadamard_scale);
  } else {
    for (int i = lane; i < n; i += 32) w.a[i] = w.x[i];
    __syncwarp();
    for (int i = lane; i < n; i += 32) {
      float acc = 0.0f;  // y_i = (((0 + R[i][0] u_0) + R[i][1] u_1) + ...), R[i][j] = R^T[j][i]
      for (int j = 0; j < n; ++j) acc = __fadd_rn(acc, __fmul_rn(r.rotation_t[j * n + i], w.a[j]));
      w.x[i] = acc;
    }
  }
  __syncwarp();
}

// quant/codec_uniform.h, per group: min / max, fp16 (scale, min), codes from the rounded
// parameters (after the format's rotation, if any).
__global__ void __launch_bounds__(kAppendWarps * 32)
    uniform_append_kernel(const UniformFormat f, const PagedBatch b, const AppendRows rows,
                          const BlockGeometry g) {
  __shared__ VectorScratch scratch[kAppendWarps];
  const int lane = threadIdx.x % 32;
  Job job;
  if (!warp_job(b, rows, f.kv_heads, f.head_dim, &job)) return;
  const VectorId& id = job.id;
  const Target& t = job.target;
  const UniformTensorFormat& tf = id.role == 0 ? f.key : f.value;
  VectorScratch& w = scratch[threadIdx.x / 32];
  load_vector(job.src, nullptr, id.head, f.head_dim, w.x, lane);
  if (f.rotated) rotate_vector((id.role == 0 ? f.key_rotation : f.value_rotation).seg[0], w, lane);
  uint16_t* params =
      reinterpret_cast<uint16_t*>(t.block + (id.role == 0 ? g.k_aux_offset : g.v_aux_offset)) +
      t.row * tf.groups * 2;
  const float top = float((1 << tf.bits) - 1);
  for (int group = 0; group < tf.groups; ++group) {
    const int begin = group * tf.group_size, end = min(f.head_dim, begin + tf.group_size);
    float mn = INFINITY, mx = -INFINITY;  // min / max of finite values: any order
    for (int i = begin + lane; i < end; i += 32) {
      mn = fminf(mn, w.x[i]);
      mx = fmaxf(mx, w.x[i]);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, offset));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
    }
    mn = __fadd_rn(mn, 0.0f);  // -0 -> +0
    mx = __fadd_rn(mx, 0.0f);
    const uint16_t scale_bits = to_f16_bits(__fdiv_rn(__fsub_rn(mx, mn), top));
    const uint16_t min_bits = to_f16_bits(mn);
    const float s = __half2float(__ushort_as_half(scale_bits));
    const float m = __half2float(__ushort_as_half(min_bits));
    const float inv = s > 0 ? __fdiv_rn(1.0f, s) : 0.0f;
    for (int i = begin + lane; i < end; i += 32) {
      const float level = floorf(__fadd_rn(__fmul_rn(__fsub_rn(w.x[i], m), inv), 0.5f));
      w.code[i] = uint8_t(fminf(fmaxf(level, 0.0f), top));  // NaN -> 0
    }
    if (lane == 0) {
      params[2 * group] = scale_bits;
      params[2 * group + 1] = min_bits;
    }
  }
  __syncwarp();
  pack_codes(w.code, f.head_dim, tf.bits,
             t.block + (id.role == 0 ? g.k_offset : g.v_offset) + t.row * tf.code_bytes, lane);
}

__global__ void __launch_bounds__(kAppendWarps * 32)
    dense_append_kernel(const DenseFormat f, const PagedBatch b, const AppendRows rows,
                        const BlockGeometry g) {
  const int lane = threadIdx.x % 32;
  Job job;
  if (!warp_job(b, rows, f.kv_heads, f.head_dim, &job)) return;
  const VectorId& id = job.id;
  const Target& t = job.target;
  const float* src = job.src;
  uint8_t* section = t.block + (id.role == 0 ? g.k_offset : g.v_offset);
  const size_t first = t.row * f.head_dim;
  for (int i = lane; i < f.head_dim; i += 32) {
    const float x = src[i];
    if (f.elem == DenseElem::kF32) {
      reinterpret_cast<float*>(section)[first + i] = x;
    } else if (f.elem == DenseElem::kF16) {
      reinterpret_cast<uint16_t*>(section)[first + i] = to_f16_bits(x);
    } else {
      reinterpret_cast<uint16_t*>(section)[first + i] = to_bf16_bits(x);
    }
  }
}

// Grid of the append kernels; false when there is nothing to write.
bool append_grid(const PagedBatch& b, const AppendRows& rows, int kv_heads, dim3* grid) {
  check_batch(b, "paged append");
  if (rows.rows < 0) {
    throw InvalidArgument(str_cat("paged append: rows ", rows.rows, " must be >= 0"));
  }
  if (rows.rows == 0) return false;
  if (rows.k == nullptr || rows.v == nullptr || rows.row_seq == nullptr ||
      rows.row_pos == nullptr) {
    throw InvalidArgument("paged append: k, v, row_seq and row_pos are required");
  }
  const int64_t vectors = int64_t(rows.rows) * kv_heads * 2;
  const int64_t blocks = (vectors + kAppendWarps - 1) / kAppendWarps;
  if (blocks > 0x7fffffff) {
    throw InvalidArgument(str_cat("paged append: ", rows.rows, " rows x ", kv_heads,
                                  " KV heads are too many for one call"));
  }
  *grid = dim3(unsigned(blocks));
  return true;
}

}  // namespace
}  // namespace paged

void paged_append(const DenseFormat& f, const PagedBatch& b, const AppendRows& rows,
                  cudaStream_t stream) {
  const BlockGeometry g = block_geometry(f);
  dim3 grid;
  if (!paged::append_grid(b, rows, f.kv_heads, &grid)) return;
  paged::launch_kernel(paged::dense_append_kernel, grid, dim3(paged::kAppendWarps * 32), 0, stream,
                       f, b, rows, g);
}

void paged_append(const TQFormat& f, const PagedBatch& b, const TQSequenceState* states,
                  const AppendRows& rows, cudaStream_t stream) {
  const BlockGeometry g = block_geometry(f);
  dim3 grid;
  if (!paged::append_grid(b, rows, f.kv_heads, &grid)) return;
  paged::launch_kernel(paged::tq_append_kernel, grid, dim3(paged::kAppendWarps * 32), 0, stream, f,
                       b, states, rows, g);
}

void paged_append(const UniformFormat& f, const PagedBatch& b, const AppendRows& rows,
                  cudaStream_t stream) {
  const BlockGeometry g = block_geometry(f);
  dim3 grid;
  if (!paged::append_grid(b, rows, f.kv_heads, &grid)) return;
  paged::launch_kernel(paged::uniform_append_kernel, grid, dim3(paged::kAppendWarps * 32), 0,
                       stream, f, b, rows, g);
}

}  // namespace turbokv::cuda
