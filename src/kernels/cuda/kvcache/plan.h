// Internals of the paged kernels shared by their host launchers (plan.cc, launch.cc) and the
// device code (*.cu): the checks of the public formats, the split / staging plan of an attention
// call and the kernel arguments it becomes.
//
// Attention work split: a block serves kRows consecutive head-rows (row r of a sequence's KV
// head h is query r / group of query head h * group + r % group) of one sequence, one KV head
// and one split (split_tokens consecutive tokens) of the keys. Each of its warps takes 32-token
// tiles of the split in turn (tile w, w + warps, ...), copies the tile's sections of the KV block
// into its shared-memory stage with cp.async, scores the tile (lane = token) and accumulates its
// values (lane = dims), keeping an online softmax {m, l, acc} per row. The block combines its
// warps and writes one partial per row; the merge kernel combines the splits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kvcache/paged.h"

namespace turbokv::cuda::paged {

constexpr int kRows = 4;          // head-rows per block
constexpr int kTileTokens = 32;   // tokens per warp step (lane = token while scoring)
constexpr int kSplitChunk = 128;  // split lengths are multiples of this (and of kTileTokens)
constexpr int kMaxHeadDim = 256;
constexpr int kMaxWarps = 4;
constexpr int kMaxSplits = 256;
constexpr int kMaxDynamicSmem = 160 * 1024;
// Staging configurations above this shrink (fewer stages, then fewer warps): two blocks per SM.
constexpr int kStageBudget = 100 * 1024;
constexpr int kTilesPerBlock = kBlockTokens / kTileTokens;
static_assert(kBlockTokens % kSplitChunk == 0 || kSplitChunk % kBlockTokens == 0,
              "splits align with KV blocks");
static_assert(kSplitChunk % kTileTokens == 0, "a tile never straddles two splits");

// One section of a KV block (keys, values, key aux, value aux) as a warp stages a tile of it:
// the tile's 32 rows of row_bytes each, from section_offset + (kv_head * kBlockTokens + token)
// * row_bytes of the block. unit > 0: row by row in unit-byte copies (16, 8 or 4) into rows
// smem_stride apart, an odd multiple of unit so that lanes reading "their" row hit distinct
// banks; unit == 0: the 32 rows as one contiguous span in 16-B copies (smem_stride ==
// row_bytes), for row sizes that are not a multiple of 4.
struct StageRegion {
  int section_offset = 0;
  int row_bytes = 0;  // 0: the format has no such section (dense aux)
  int smem_offset = 0;
  int smem_stride = 0;
  int unit = 0;
};

enum Region { kKeys = 0, kValues = 1, kKeyAux = 2, kValueAux = 3, kRegions = 4 };

struct StagePlan {
  StageRegion region[kRegions];
  int stage_bytes = 0;  // one stage of one warp (multiple of 16)
  int stages = 2;       // 1 or 2 per warp (double buffering)
  int warps = kMaxWarps;
  int smem_bytes = 0;  // dynamic shared memory of the attention kernel
};

// Kernel arguments of the split-K attention pass.
struct AttnArgs {
  const uint8_t* const* table = nullptr;  // [batch, table_stride]
  int table_stride = 0;
  int table_tokens = 0;  // table_stride * kBlockTokens: seq_len is clamped to it
  const int* seq_len = nullptr;
  int batch = 0;
  const float* q = nullptr;
  const int* q_start = nullptr;
  int max_n_q = 0;
  int n_heads = 0;
  int kv_heads = 0;
  int group = 0;  // n_heads / kv_heads
  int head_dim = 0;
  int row_groups = 0;  // ceil(max_n_q * group / kRows)
  int splits = 0;
  int split_tokens = 0;
  float scale = 0;
  float softcap = 0;
  int window = 0;
  int key_begin = 0;  // keys at positions below it are not attended (TurboQuant sink tokens)
  // A query at position p attends keys below p + 1 - recent only (TurboQuant recent tokens).
  int recent = 0;
  // Partials of (sequence b, query i < max_n_q, head, split), index
  // ((b * max_n_q + i) * n_heads + head) * splits + split: acc [head_dim] in the codec frame,
  // ml = (max of log2-scores, Σ 2^(s - max)).
  float* part_acc = nullptr;
  float2* part_ml = nullptr;
  StagePlan stage;
};

// Kernel arguments of the merge pass (grid: max_n_q * n_heads, batch).
struct MergeArgs {
  const int* seq_len = nullptr;
  const int* q_start = nullptr;
  float* out = nullptr;
  float* lse = nullptr;                     // optional
  const TQSequenceState* states = nullptr;  // TurboQuant: [batch] (nullable)
  const float* part_acc = nullptr;
  const float2* part_ml = nullptr;
  int table_tokens = 0;
  int max_n_q = 0;
  int n_heads = 0;
  int group = 0;
  int head_dim = 0;
  int splits = 0;
  int split_tokens = 0;
};

// Kernel arguments of the sink pass (grid: max_n_q * n_heads, batch): attention over the fp16
// sink rows of TQSequenceState and, with recent tokens, the query's window of fp16 rows (the
// ring of TQSequenceState before the step's queries, k_new / v_new rounded to fp16 from the
// first query's position on), merged into out by log-sum-exp with the coded part's (lse in,
// then the merged one).
struct SinkArgs {
  const TQSequenceState* states = nullptr;  // [batch]
  const int* seq_len = nullptr;
  const int* q_start = nullptr;
  const float* q = nullptr;
  float* out = nullptr;
  float* lse = nullptr;  // [rows, n_heads]: the coded part's, overwritten with the merged one
  int table_tokens = 0;
  int max_n_q = 0;
  int n_heads = 0;
  int group = 0;
  int head_dim = 0;
  int sink_tokens = 0;
  int recent_tokens = 0;
  int kv_heads = 0;
  const float* k_new = nullptr;  // [rows, kv_heads, head_dim] (recent_tokens > 0)
  const float* v_new = nullptr;
  float scale = 0;
  float softcap = 0;
  int window = 0;
};

// Kernel arguments of the ring update (grid: min(max_n_q, recent_tokens - 1), batch).
struct RecentArgs {
  const TQSequenceState* states = nullptr;
  const int* seq_len = nullptr;
  const int* q_start = nullptr;
  const float* k_new = nullptr;
  const float* v_new = nullptr;
  int table_tokens = 0;
  int max_n_q = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int sink_tokens = 0;
  int recent_tokens = 0;
};

// ---------------------------------------------------------------------------------------------
// Host side (plan.cc).

// Throw InvalidArgument naming the bad field and what is allowed.
void check_format(const DenseFormat& f);
void check_format(const TQFormat& f);
void check_format(const UniformFormat& f);
void check_batch(const PagedBatch& b, const char* what, bool pointers = true);

// The split grid and workspace layout of a call (no device pointers yet).
struct SplitPlan {
  int group = 0;
  int row_groups = 0;
  int splits = 1;
  int split_tokens = kSplitChunk;
  size_t partials = 0;   // batch * max_n_q * n_heads * splits
  size_t acc_bytes = 0;  // partials * head_dim floats, rounded up to 256
  size_t workspace = 0;  // acc_bytes + partials * sizeof(float2)
};
// sms: the device's multiprocessors (the split count fills 4 blocks per SM).
SplitPlan plan_splits(const PagedBatch& b, const QueryRows& q, const AttentionOptions& o,
                      int kv_heads, int head_dim, int sms);

// Staging of a format's sections: row bytes and section offsets per region (0 bytes: none).
StagePlan plan_stages(const BlockGeometry& g, const int (&row_bytes)[kRegions], int head_dim);

// Kernel arguments from the validated inputs (checks the queries, options and workspace).
AttnArgs make_attention_args(const PagedBatch& b, const QueryRows& q, const AttentionOptions& o,
                             int kv_heads, int head_dim, const StagePlan& stage, void* workspace,
                             size_t workspace_bytes, MergeArgs* merge);

// ---------------------------------------------------------------------------------------------
// Launchers (one translation unit per kernel family).

void launch_dense_attention(const AttnArgs& a, const DenseFormat& f, cudaStream_t stream);
void launch_uniform_attention(const AttnArgs& a, const UniformFormat& f, cudaStream_t stream);
void launch_tq_attention_generic(const AttnArgs& a, const TQFormat& f,
                                 const TQSequenceState* states, cudaStream_t stream);
// Compile-time kernels of single-segment codecs, key and value bits 2..4, for one head_dim;
// false when the format has none.
bool launch_tq_attention_d64(const AttnArgs& a, const TQFormat& f, const TQSequenceState* states,
                             cudaStream_t stream);
bool launch_tq_attention_d128(const AttnArgs& a, const TQFormat& f, const TQSequenceState* states,
                              cudaStream_t stream);
bool launch_tq_attention_d256(const AttnArgs& a, const TQFormat& f, const TQSequenceState* states,
                              cudaStream_t stream);
// value: the TurboQuant format to take rows back from the values' rotated frame with
// (m.states: the sequences' channel orders and value means); nullptr: the partials are in the
// natural frame already.
void launch_merge(const MergeArgs& m, const TQFormat* value, int batch, cudaStream_t stream);
void launch_sink_merge(const SinkArgs& s, int batch, cudaStream_t stream);
void launch_recent_update(const RecentArgs& r, int batch, cudaStream_t stream);

}  // namespace turbokv::cuda::paged
