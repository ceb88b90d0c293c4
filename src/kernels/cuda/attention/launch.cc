// Planning of the split-K grid (one wave of blocks on the device, or fixed split lengths in
// waves of sequences) and the workspace:
//   [part_acc][part_ml] (params.h)
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention/kernels.h"
#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {
namespace {

struct SplitPlan {
  attn::AttentionArgs args;
  size_t partials = 0;  // (sequence, kv head, row, split) tuples
  int wave = 0;         // sequences per launch
};

// Launches `launch(args, count)` over the batch in waves of plan.wave sequences, each wave's
// arguments offset to its first sequence (its partials reuse the start of the workspace, which
// every launch leaves zeroed).
template <typename Launch>
void launch_waves(const SplitPlan& plan, const AttentionProblem& problem, Launch&& launch) {
  const attn::AttentionArgs& a = plan.args;
  const size_t q_stride = size_t(a.n_q) * a.n_heads * attn::kHeadDim;
  for (int b0 = 0; b0 < problem.batch; b0 += plan.wave) {
    attn::AttentionArgs w = a;
    w.q = a.q + size_t(b0) * q_stride;
    w.out = a.out + size_t(b0) * q_stride;
    w.seq_lens = a.seq_lens + b0;
    w.block_table = a.block_table + size_t(b0) * size_t(a.table_stride);
    if (b0 > 0) w.timeline = nullptr;
    launch(w, std::min(plan.wave, problem.batch - b0));
    TURBOKV_CUDA_CHECK_LAUNCH();
  }
}

void validate(const AttentionProblem& p) {
  if (p.batch < 1 || p.n_q < 1 || p.kv_heads < 1 || p.n_heads < p.kv_heads ||
      p.n_heads % p.kv_heads != 0) {
    throw InvalidArgument(str_cat("CUDA attention: batch ", p.batch, ", n_q ", p.n_q, ", n_heads ",
                                  p.n_heads, ", kv_heads ", p.kv_heads,
                                  ": need batch, n_q >= 1 and n_heads a positive multiple of "
                                  "kv_heads"));
  }
  if (p.max_len < p.n_q) {
    throw InvalidArgument(
        str_cat("CUDA attention: max_len ", p.max_len, " is shorter than the ", p.n_q, " queries"));
  }
  if (!(p.scale > 0)) {
    throw InvalidArgument(str_cat("CUDA attention: scale ", p.scale, " must be > 0"));
  }
  if (p.split_tokens < 0 || p.split_tokens % attn::kTileTokens != 0) {
    throw InvalidArgument(str_cat("CUDA attention: split_tokens ", p.split_tokens,
                                  " must be 0 or a positive multiple of ", attn::kTileTokens));
  }
}

SplitPlan plan(const AttentionProblem& p, CacheKind kind) {
  validate(p);
  static const int sms = sm_count();
  static const int dense_blocks = attn::dense_attention_blocks_per_sm();
  SplitPlan plan;
  attn::AttentionArgs& a = plan.args;
  a.q = p.q;
  a.seq_lens = p.seq_lens;
  a.n_q = p.n_q;
  a.n_heads = p.n_heads;
  a.kv_heads = p.kv_heads;
  a.group = p.n_heads / p.kv_heads;
  a.rows = p.n_q * a.group;
  a.row_groups = (a.rows + attn::kColumns - 1) / attn::kColumns;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  const int max_tiles = (p.max_len + attn::kTileTokens - 1) / attn::kTileTokens;
  const int slots = sms * (kind == CacheKind::kTurboQuant ? 1 : dense_blocks);
  if (p.split_tokens > 0) {
    // Fixed split lengths: each sequence's splits (and so its sums) depend on its length alone.
    a.tiles_per_split = std::max(p.split_tokens / attn::kTileTokens,
                                 (max_tiles + attn::kMaxSplits - 1) / attn::kMaxSplits);
  } else {
    // As many splits as fill one wave of resident blocks (never more than one per tile).
    const int base = p.batch * p.kv_heads * a.row_groups;
    const int splits = std::clamp(slots / base, 1, std::min(max_tiles, attn::kMaxSplits));
    a.tiles_per_split = (max_tiles + splits - 1) / splits;
  }
  a.splits = (max_tiles + a.tiles_per_split - 1) / a.tiles_per_split;
  // Sequences per launch: all of them, or with fixed splits as many as one wave holds (a
  // split-0 block waits for its row group's other splits, so they must be resident with it).
  plan.wave = p.batch;
  if (p.split_tokens > 0 && a.splits > 1) {
    plan.wave = std::clamp(slots / (p.kv_heads * a.row_groups * a.splits), 1, p.batch);
  }
  plan.partials = size_t(p.batch) * p.kv_heads * a.rows * a.splits;
  a.out = p.out;
  a.timeline = p.timeline;
  a.programmatic = p.programmatic_launch ? 1 : 0;
  return plan;
}

void check_table(const uint8_t* const* table, int stride, int max_len) {
  if (table == nullptr || int64_t(stride) * attn::kBlockTiles * attn::kTileTokens < max_len) {
    throw InvalidArgument(str_cat("CUDA attention: max_len ", max_len,
                                  " exceeds the block table's capacity of ", stride,
                                  " blocks of 256 tokens"));
  }
}

size_t workspace_bytes(const SplitPlan& plan) {
  return plan.partials * (attn::kHeadDim / 4 * sizeof(uint4) + sizeof(uint2));
}

void bind_workspace(SplitPlan& plan, void* workspace, size_t bytes) {
  if (workspace == nullptr || bytes < workspace_bytes(plan)) {
    throw InvalidArgument(str_cat("CUDA attention: workspace of ", bytes, " B, need ",
                                  workspace_bytes(plan), " B (attention_workspace_bytes)"));
  }
  char* base = static_cast<char*>(workspace);
  plan.args.part_acc = reinterpret_cast<uint4*>(base);
  plan.args.part_ml =
      reinterpret_cast<uint2*>(plan.args.part_acc + plan.partials * (attn::kHeadDim / 4));
}

}  // namespace

bool tq_attention_supported(int key_bits, int value_bits) {
#define TURBOKV_TQ_SUPPORTED(kb, vb) \
  if (key_bits == kb && value_bits == vb) return true;
  TURBOKV_TQ_ATTENTION_BITS(TURBOKV_TQ_SUPPORTED)
#undef TURBOKV_TQ_SUPPORTED
  return false;
}

namespace attn {

void launch_tq_attention(const AttentionArgs& args, const TQKernelCodec& codec, int batch,
                         cudaStream_t stream) {
#define TURBOKV_TQ_LAUNCH(kb, vb)                                 \
  if (codec.key_bits == kb && codec.value_bits == vb) {           \
    launch_tq_attention_k##kb##v##vb(args, codec, batch, stream); \
    return;                                                     \
  }
  TURBOKV_TQ_ATTENTION_BITS(TURBOKV_TQ_LAUNCH)
#undef TURBOKV_TQ_LAUNCH
  throw Unsupported(str_cat("CUDA TurboQuant attention: no fused kernel for K", codec.key_bits,
                            "/V", codec.value_bits));
}

}  // namespace attn

size_t attention_workspace_bytes(const AttentionProblem& problem, CacheKind kind) {
  return workspace_bytes(plan(problem, kind));
}

void tq_attention(const TQKernelCodec& codec, const TQCacheView& cache,
                  const AttentionProblem& problem, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  SplitPlan p = plan(problem, CacheKind::kTurboQuant);
  check_table(cache.block_table, cache.table_stride, problem.max_len);
  bind_workspace(p, workspace, workspace_bytes);
  p.args.block_table = cache.block_table;
  p.args.table_stride = cache.table_stride;
  p.args.value_norm_max = cache.value_norm_max;
  p.args.unrotate = 1;
  p.args.hadamard_scale = codec.hadamard_scale;
  std::copy(std::begin(codec.value_sign_flips), std::end(codec.value_sign_flips),
            p.args.value_sign_flips);
  launch_waves(p, problem, [&](const attn::AttentionArgs& args, int batch) {
    attn::launch_tq_attention(args, codec, batch, stream);
  });
}

void dense_attention(const DenseCacheView& cache, const AttentionProblem& problem, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream) {
  SplitPlan p = plan(problem, CacheKind::kDense);
  check_table(cache.block_table, cache.table_stride, problem.max_len);
  bind_workspace(p, workspace, workspace_bytes);
  p.args.block_table = cache.block_table;
  p.args.table_stride = cache.table_stride;
  launch_waves(p, problem, [&](const attn::AttentionArgs& args, int batch) {
    attn::launch_dense_attention(args, batch, stream);
  });
}

}  // namespace turbokv::cuda
