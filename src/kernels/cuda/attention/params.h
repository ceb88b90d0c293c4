// Kernel arguments of the decode / prefill attention kernels and their merge step (host and
// device). Shapes (row-major):
//   q, out    [batch, n_q, n_heads, 128] fp32; the n_q queries are the last n_q positions of
//             each sequence (query i of sequence b sees tokens < seq_len[b] - n_q + i + 1)
//   part_acc  [batch, kv_heads, rows, splits, 32] uint4 (128 dims)   rows = n_q * group
//   part_ml   [batch, kv_heads, rows, splits] uint2 (max of log2-scores, sum of 2^(s - max))
// The partials hold fp32 bits XOR kPartialKey (merge.cuh): all-zero words read as "not written
// yet", so the merger polls the data itself and needs no flags.
// A block serves one KV head's 8 query rows ("columns" of its tensor-core tiles) over one
// split of the sequence, so one pass over a KV head's cache serves all its query heads.
#pragma once

#include <vector_types.h>

#include <cstdint>

namespace turbokv::cuda::attn {

constexpr int kHeadDim = 128;
constexpr int kTileTokens = 32;
constexpr int kColumns = 8;  // query rows per block: the N of the m16n8k16 MMA
constexpr int kWarps = 4;    // dense kernel: warps per block; warp w takes tiles w, w + 4, ...
constexpr int kMaxSplits = 128;
constexpr int kBlockTiles = 8;  // tiles of a 256-token cache block
// Value operands of the MMAs are fp16: p * norm with p <= 2^kLazySlack (state.cuh) stays
// finite while norms are <= kMaxPlainValueNorm; above it the kernels scale by a power of two.
constexpr float kMaxPlainValueNorm = 2048.0f;

struct AttentionArgs {
  const float* q = nullptr;
  const int* seq_lens = nullptr;  // [batch], device
  float* out = nullptr;
  // Zero before the first call; split 0's block zeroes what it merged, so they are zero again
  // after every call.
  uint4* part_acc = nullptr;
  uint2* part_ml = nullptr;
  int n_q = 0;
  int n_heads = 0;
  int kv_heads = 0;
  int group = 0;         // n_heads / kv_heads
  int rows = 0;          // n_q * group
  int row_groups = 0;    // ceil(rows / kColumns)
  float scale_log2 = 0;  // attention scale * log2(e)
  int tiles_per_split = 0;
  int splits = 0;
  // TurboQuant: out = R_v^T acc (Hadamard butterflies, * scale, sign flips); dense: identity.
  int unrotate = 0;
  float hadamard_scale = 1;
  uint32_t value_sign_flips[4] = {0, 0, 0, 0};
  int programmatic = 0;  // launched with PDL: wait for the previous kernel before reading
  // Paged cache (kvcache/paged.h): block_table[b * table_stride + i] holds tokens
  // [256 i, 256 (i + 1)) of sequence b.
  const uint8_t* const* block_table = nullptr;
  int table_stride = 0;
  // TurboQuant: the largest stored value norm (float bits, device) or nullptr.
  const unsigned* value_norm_max = nullptr;
  // Profiling only (nullptr otherwise): kTimelinePoints stamps per block, see stamp().
  unsigned long long* timeline = nullptr;
};

// Timeline points of one block (%globaltimer ns; 0 where the block never got there):
// entry, prologue done (tables and rotated queries ready), warp 0 out of its tile loop,
// split partial written, done (split > 0) or warp 0 has every split's partial of its row
// (split 0), merge done (split 0 only), SM id, 1 if the block merged its row group.
enum TimelinePoint {
  kStampEntry,
  kStampPrologue,
  kStampLoop,
  kStampPartial,
  kStampPublished,
  kStampMerged,
  kStampSm,
  kStampLast,
  kTimelinePoints
};

}  // namespace turbokv::cuda::attn
