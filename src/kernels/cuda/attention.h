// Public entry points of the CUDA attention kernels (decode = n_q 1; prefill over a cached
// past = n_q > 1, queries at the last n_q positions, causal). All pointers are device
// pointers; work is queued on `stream` and nothing synchronizes.
//
//   q, out     [batch, n_q, n_heads, 128] fp32
//   seq_lens   [batch] int: tokens in each sequence's cache (the queries' own included)
//   caches     paged (kvcache/paged.h): block_table [batch, table_stride] device pointers to
//              blocks of 256 tokens;
//              TurboQuant block: [kv_heads][8 tiles][tile bytes of the codec's bits]
//              (tq_layout.h),
//              dense block: [K: kv_heads][256][128] fp16 | [V: kv_heads][256][128] fp16.
//              Entries past a sequence's blocks must point at a readable (e.g. zero) block.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/tq_codec.h"

namespace turbokv::cuda {

enum class CacheKind { kTurboQuant, kDense };

struct AttentionProblem {
  const float* q = nullptr;
  const int* seq_lens = nullptr;
  float* out = nullptr;
  int batch = 0;
  int n_q = 1;
  int n_heads = 0;
  int kv_heads = 0;
  int max_len = 0;  // host-side max of seq_lens (sizes the split grid); every len >= n_q
  float scale = 0;  // score = scale * <q, k>
  // 0: as many key splits as fill one wave of the device (their length depends on the batch and
  // max_len). > 0 (a multiple of 32): splits of this many keys whatever the batch (more when a
  // sequence would need over kMaxSplits), so each sequence's result does not depend on the
  // others in the call (batch-invariant decoding); the call is then launched in as many waves
  // of sequences as the device holds.
  int split_tokens = 0;
  // Programmatic dependent launch (PDL): the kernel may start while the kernel before it on the
  // stream is still finishing, fills its shared-memory tables and prefetches the first cache
  // tiles to L2, and waits for that kernel to complete (griddepcontrol.wait) before it reads
  // anything: q, seq_lens, the cache, the workspace. Same results; it hides the launch gap
  // when the previous kernel lets its successor start early (ours do, after their tile loop).
  bool programmatic_launch = false;
  // Profiling only: when set, the TurboQuant kernel writes attn::kTimelinePoints %globaltimer
  // stamps per block here (attention/params.h says which); grid order, device memory.
  unsigned long long* timeline = nullptr;
};

struct TQCacheView {
  const uint8_t* const* block_table = nullptr;  // [batch, table_stride] (device)
  int table_stride = 0;                         // capacity: table_stride * 256 tokens
  // The largest value norm in the cache as float bits (tq_quantize's value_norm_max; device).
  // The kernel scales its fp16 value operands by a power of two when it exceeds 4096, so any
  // norm is exact; nullptr: norms are known to be <= 4096.
  const unsigned* value_norm_max = nullptr;
};

struct DenseCacheView {
  const uint8_t* const* block_table = nullptr;  // [batch, table_stride] (device)
  int table_stride = 0;
};

// Bytes of scratch the attention call needs for this problem (the splits' partial results).
// The workspace must be zero-filled before its first use (cudaMemset); every call
// leaves it ready for the next one, so it can be allocated once and reused (and captured in a
// CUDA graph). Calls sharing a workspace must not run concurrently.
size_t attention_workspace_bytes(const AttentionProblem& problem, CacheKind kind);

// Whether tq_attention has a kernel for codecs of these bits (TQKernelCodec::key_bits,
// value_bits): K3/V4, K4/V3, K4/V4, K3/V3, K2/V3, K3/V2.
bool tq_attention_supported(int key_bits, int value_bits);

// Throw InvalidArgument for shapes they do not support (naming the value and what is
// allowed) or a workspace smaller than attention_workspace_bytes().
void tq_attention(const TQKernelCodec& codec, const TQCacheView& cache,
                  const AttentionProblem& problem, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream);
void dense_attention(const DenseCacheView& cache, const AttentionProblem& problem, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream);

}  // namespace turbokv::cuda
