// Paged KV caches on the GPU: the block formats and the kernels that write and read them.
//
// A sequence's cache for one layer is a list of blocks of kBlockTokens tokens; block i holds
// tokens [i * kBlockTokens, (i + 1) * kBlockTokens) for every KV head. A block table row per
// sequence lists the blocks' device addresses; entries past the sequence's blocks point at a
// zero-filled block of the same format (so a kernel may read ahead without a bounds check).
// Blocks come from a shared pool (kv/device_pool.h), so one long sequence and many short ones
// share one budget, and a block can be shared by several sequences (prefix caching). Every
// block starts at a multiple of 16 B (the kernels copy 16-B chunks of it).
//
// Block layouts (row-major; every section starts at a multiple of 16 B):
//   kDense (T = float, __half or __nv_bfloat16):
//     [K: kv_heads][kBlockTokens][head_dim] T | [V: kv_heads][kBlockTokens][head_dim] T
//   kTurboQuant (the CPU codecs' records, quant/codec.h: LSB-first codes, fp16 norms):
//     [K codes: kv_heads][kBlockTokens][key code_bytes]
//     [V codes: kv_heads][kBlockTokens][value code_bytes]
//     [K norms: kv_heads][kBlockTokens][key norms_per_vector] fp16
//     [V norms: kv_heads][kBlockTokens][value norms_per_vector] fp16
//   kUniform (quant/codec_uniform.h records):
//     [K codes][V codes] as above | [K params: kv_heads][kBlockTokens][groups][2] fp16 (scale,
//     min) | [V params]
//   kTurboQuant35 (the fused K3/V4, head_dim 128 format of kernels/cuda/tq_layout.h):
//     [kv_heads][kBlockTokens / 32 tiles][3712 B]
// So a token's codes and norms are byte-identical to the CPU cache's rows (tq_layout.h
// converts the fused format), and save/load goes through the CPU caches' file records.
//
// Kernels (kvcache/formats.h builds the formats from the CPU codecs):
//   paged_append     one warp per (row, KV head, K or V) vector; writes only that vector's
//                    bytes (codes, norms / params, elements), so appends to different tokens
//                    of one block may run in any order.
//   paged_attention  two launches on the stream: the split-K pass (one block per query-row
//                    group of 4 head-rows, KV head, sequence and split of the keys) writes
//                    per-split partials into the workspace, the merge pass combines them,
//                    takes TurboQuant rows back from the rotated frame and writes out. fp32
//                    arithmetic throughout (scores on the codes, no dequantized copy).
//                    TurboQuant formats whose key and value codecs are single-segment with
//                    bits in {2, 3, 4} and head_dim 64, 128 or 256 take compile-time kernels;
//                    split codecs, other bits or dims, uniform and dense formats a
//                    runtime-generic kernel of the same structure.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace turbokv::cuda {

constexpr int kBlockTokens = 256;

enum class DenseElem : uint8_t { kF32, kF16, kBF16 };

// ---------------------------------------------------------------------------------------------
// Formats (host and device). Offsets are within one block.

struct DenseFormat {
  DenseElem elem = DenseElem::kF16;
  int kv_heads = 0;
  int head_dim = 0;  // 1..256
};

// One segment of a TurboQuant vector: an MSE codec over `dim` of the vector's channels. An
// integer-bit codec is one segment over all channels in natural order; the split codec
// (k + 0.5 bits) is two: the high channels at k + 1 bits, then the low ones at k bits.
// Operation order of the quantize kernel: quant/codec_mse.h and quant/rotation.h, bit for bit.
struct TQSegment {
  int dim = 0;
  int bits = 0;              // 1..8
  int code_offset = 0;       // byte offset of the segment's codes inside the vector's codes
  int norm_index = 0;        // which of the vector's fp16 norms is this segment's
  int norm_correction = 1;   // stored norm: 1 n / ||c||, 2 n / <y, c> (unbiased), 0 n
  int hadamard = 0;          // 1: randomized Hadamard (dim a power of two), else a dense matrix
  float hadamard_scale = 0;  // float(1 / sqrt(dim))
  const uint32_t* sign_words = nullptr;  // [ceil(dim / 32)] bit i: channel i flips (Hadamard)
  const float* rotation = nullptr;       // [dim, dim] row-major R (dense), y = R u
  const float* rotation_t = nullptr;     // [dim, dim] R^T (dense)
  const float* centroids = nullptr;      // [2^bits]
  const float* boundaries = nullptr;     // [2^bits - 1]
  // Segment coordinate i of KV head h is channel order[h * head_dim + channel_offset + i] of
  // the vector (TQSequenceState::*_order; channel channel_offset + i when that is null).
  // channel_offset is the dims of the segments before this one.
  int channel_offset = 0;
};

struct TQTensorFormat {
  int segments = 1;  // 1 or 2
  TQSegment seg[2];
  int code_bytes = 0;        // per vector, all segments
  int norms_per_vector = 1;  // == segments
};

// State a TurboQuant cache fixes from the first chunk it sees, per sequence (device pointers,
// nullptr = none). The kernels take one per sequence of the batch: `const TQSequenceState*
// states` [batch] in device memory (states == nullptr: every field null for every sequence).
//  - *_order [kv_heads, head_dim]: the split codec's channel order per KV head (high channels
//    first); null for integer bits (natural order).
//  - *_mean [kv_heads, head_dim] fp16: centering; the coded vector is x - float(mean) (fp32
//    subtraction). Attention adds float(value_mean) to the output and <q, float(key_mean)> to
//    every raw score of the query (a constant shift: the softmax is unchanged, except under a
//    soft-cap, and the log-sum-exp output includes it), so it attends over codes + mean.
//  - sink_keys / sink_values [kv_heads, sink_tokens, head_dim] fp16: the sequence's first
//    TQFormat::sink_tokens positions, kept uncoded (and uncentered); required when the format
//    has sink tokens.
//  - recent_keys / recent_values [kv_heads, recent_tokens - 1, head_dim] fp16: a ring of the
//    sequence's last recent_tokens - 1 positions before the step's queries (slot = position %
//    (recent_tokens - 1), positions >= sink_tokens only), uncentered; required when the format
//    has recent_tokens > 1. paged_recent_update writes it after the step's attention.
struct TQSequenceState {
  const int* key_order = nullptr;
  const int* value_order = nullptr;
  const __half* key_mean = nullptr;
  const __half* value_mean = nullptr;
  __half* sink_keys = nullptr;
  __half* sink_values = nullptr;
  __half* recent_keys = nullptr;
  __half* recent_values = nullptr;
};

struct TQFormat {
  int kv_heads = 0;
  int head_dim = 0;           // 2..256
  TQTensorFormat key, value;  // all pointers are device pointers
  // Positions 0 .. sink_tokens - 1 of every sequence are fp16 rows in TQSequenceState (the
  // CPU cache's sink tokens): paged_append writes them there (rounded like core/half.h, never
  // centered), their slots in the blocks stay unused, and paged_attention attends them apart
  // and merges the two softmaxes by log-sum-exp.
  int sink_tokens = 0;
  // W > 0 (the CPU cache's recent tokens): a query at position p reads the coded keys only
  // below p - W + 1 and positions max(sink_tokens, p - W + 1) .. p as fp16 rows instead (the
  // query's own step's keys and values from QueryRows::k_new / v_new rounded to fp16, earlier
  // positions from the TQSequenceState ring), merged like the sink rows. Codes are written as
  // with W = 0.
  int recent_tokens = 0;
};

struct UniformTensorFormat {
  int bits = 0;        // 2..8
  int group_size = 0;  // 32, 64, 128 (head_dim % group_size == 0, or the last group is short)
  int code_bytes = 0;  // per vector
  int groups = 0;      // per vector
};

struct UniformFormat {
  int kv_heads = 0;
  int head_dim = 0;  // 1..256
  UniformTensorFormat key, value;
  // 1: every key is rotated by key_rotation and every value by value_rotation before it is
  // grouped (the CPU cache's hadamard option, quant/rotation.h order bit for bit); attention
  // rotates the queries the same way and takes the output back with the values' R^T. Each is
  // one segment over head_dim of which only the rotation fields (hadamard, hadamard_scale,
  // sign_words, rotation, rotation_t) and dim are read.
  int rotated = 0;
  TQTensorFormat key_rotation, value_rotation;
};

// Bytes of one block and the offsets of its sections.
struct BlockGeometry {
  size_t block_bytes = 0;
  size_t k_offset = 0, v_offset = 0;          // codes or elements
  size_t k_aux_offset = 0, v_aux_offset = 0;  // norms (TurboQuant) or params (uniform); dense: 0
};
// Throw InvalidArgument for a format the kernels do not take (naming the field and what is
// allowed): the same checks as paged_append / paged_attention.
BlockGeometry block_geometry(const DenseFormat& f);
BlockGeometry block_geometry(const TQFormat& f);
BlockGeometry block_geometry(const UniformFormat& f);
BlockGeometry block_geometry_tq35(int kv_heads);

// ---------------------------------------------------------------------------------------------
// The sequences of one call.

struct PagedBatch {
  // [batch, table_stride] (device); paged_append writes through these pointers.
  const uint8_t* const* block_table = nullptr;
  int table_stride = 0;
  const int* seq_len = nullptr;  // [batch] tokens in each cache after this step's append (device)
  int batch = 0;
  // Host-side bound on seq_len (sizes the split grid), at most table_stride * kBlockTokens. For
  // a CUDA graph, the capacity the graph was captured for: blocks past a sequence's length
  // return at once. A seq_len above it is attended only up to the planned splits.
  int max_len = 0;
};

// Rows of new keys and values: row r belongs to sequence row_seq[r] at position row_pos[r].
// Rows with row_seq outside [0, batch) (e.g. -1: padding of a captured batch) or row_pos
// outside [0, table_stride * kBlockTokens) are skipped.
struct AppendRows {
  const float* k = nullptr;      // [rows, kv_heads, head_dim] (device)
  const float* v = nullptr;      // [rows, kv_heads, head_dim] (device)
  const int* row_seq = nullptr;  // [rows] (device)
  const int* row_pos = nullptr;  // [rows] (device)
  int rows = 0;
};

// Queries of one call: sequence b's queries are rows q_start[b] .. q_start[b + 1] - 1 of q and
// out, at its last n_q(b) positions (query i sees tokens < seq_len[b] - n_q(b) + i + 1).
// n_q(b) may be 0; queries past max_n_q of a sequence are neither read nor written.
struct QueryRows {
  const float* q = nullptr;      // [rows, n_heads, head_dim] (device)
  float* out = nullptr;          // [rows, n_heads, head_dim] (device)
  const int* q_start = nullptr;  // [batch + 1] (device)
  int max_n_q = 0;               // host-side max over the batch of n_q(b)
  // Optional [rows, n_heads] (device): each row's log-sum-exp of its scores (natural log, after
  // scale and soft-cap; -inf for a row that saw no key), to merge with attention over other
  // keys (e.g. uncoded sink tokens) by log-sum-exp weights.
  float* lse = nullptr;
  // TurboQuant formats with recent_tokens > 0 (required there, unused otherwise): [rows,
  // kv_heads, head_dim] (device), row r the key / value appended at query row r's position.
  const float* k_new = nullptr;
  const float* v_new = nullptr;
};

struct AttentionOptions {
  int n_heads = 0;          // a positive multiple of kv_heads (GQA)
  float scale = 0;          // score = scale * <q, k>
  float logit_softcap = 0;  // > 0: score = cap * tanh(score / cap)
  int sliding_window = 0;   // > 0: a query at p sees keys in (p - W, p]
  // Splits of the keys: 0 plans enough to fill the device; n > 0 asks for n (clamped to the
  // number of 128-token chunks of max_len; the results are the same up to float rounding).
  int splits = 0;
  // > 0 (a multiple of 128; overrides splits): splits of this many keys whatever the batch and
  // max_len (longer when a sequence would need more than kMaxSplits), so each sequence's result
  // does not depend on the other sequences of the call (batch-invariant decoding).
  int split_tokens = 0;
};

// Scratch of an attention call: split partials. Size it with paged_attention_workspace_bytes
// (depends on the batch, max_n_q, heads, head_dim, max_len, splits and the device's SM count);
// no zero-fill needed, 256-B alignment suffices (cudaMalloc's). Calls sharing a workspace must
// run one after the other (one stream).
size_t paged_attention_workspace_bytes(const PagedBatch& batch, const QueryRows& queries,
                                       const AttentionOptions& options, int kv_heads, int head_dim);
// A TurboQuant format's: the above, plus the coded part's log-sum-exp rows when the format has
// sink or recent tokens (queries' rows dense: q_start[b] = the queries of the sequences before
// b).
size_t paged_attention_workspace_bytes(const TQFormat& f, const PagedBatch& batch,
                                       const QueryRows& queries, const AttentionOptions& options);

// Writers: quantize (or convert) the rows into their blocks. Codes and norms are bit-identical
// to the CPU codecs (quant/), dense elements are rounded like core/half.h. Throw
// InvalidArgument for unsupported formats.
void paged_append(const DenseFormat& f, const PagedBatch& b, const AppendRows& rows,
                  cudaStream_t stream);
void paged_append(const TQFormat& f, const PagedBatch& b, const TQSequenceState* states,
                  const AppendRows& rows, cudaStream_t stream);
void paged_append(const UniformFormat& f, const PagedBatch& b, const AppendRows& rows,
                  cudaStream_t stream);

// Attention over the blocks (decode and prefill over a cached past; causal, sliding window,
// soft-cap, GQA), split over the sequence with an online-softmax merge. out may not alias q.
// A query that sees no key gets a zero row.
void paged_attention(const DenseFormat& f, const PagedBatch& b, const QueryRows& q,
                     const AttentionOptions& o, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream);
void paged_attention(const TQFormat& f, const PagedBatch& b, const TQSequenceState* states,
                     const QueryRows& q, const AttentionOptions& o, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream);
void paged_attention(const UniformFormat& f, const PagedBatch& b, const QueryRows& q,
                     const AttentionOptions& o, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream);

// After the attention of a step (TurboQuant formats with recent_tokens > 1): writes each
// sequence's last min(n_q(b), recent_tokens - 1) positions >= sink_tokens from q.k_new /
// q.v_new (the queries' rows as paged_attention reads them; q.q and q.out unused) into its
// TQSequenceState ring, rounded to fp16. b.seq_len as for the attention. Queued after the
// attention on the same stream, it never races with its reads of the ring. A no-op for
// recent_tokens <= 1.
void paged_recent_update(const TQFormat& f, const PagedBatch& b, const TQSequenceState* states,
                         const QueryRows& q, cudaStream_t stream);

// Centered values under kernels that attend the centered codes (the fused kernels): row
// ((b * n_q + i) * n_heads + head) of out [batch * n_q * n_heads, head_dim] gets
// float(states[b].value_mean[head / (n_heads / kv_heads)]) added where that mean is set.
void add_value_means(const TQSequenceState* states, int batch, int n_q, int n_heads, int kv_heads,
                     int head_dim, float* out, cudaStream_t stream);

}  // namespace turbokv::cuda
