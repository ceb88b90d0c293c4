// Host side of the paged kernels: format checks, block geometry, the split and staging plan
// of an attention call, and the attention entry points (which kernel takes which format).
#include "kernels/cuda/kvcache/plan.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {
namespace paged {
namespace {

size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}
size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
bool power_of_two(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}

void check_kv_shape(int kv_heads, int head_dim, int min_dim, const char* what) {
  if (kv_heads < 1 || kv_heads > 65535) {
    throw InvalidArgument(
        str_cat(what, " format: kv_heads ", kv_heads, " is invalid: allowed 1..65535"));
  }
  if (head_dim < min_dim || head_dim > kMaxHeadDim) {
    throw InvalidArgument(str_cat(what, " format: head_dim ", head_dim, " is invalid: allowed ",
                                  min_dim, "..", kMaxHeadDim));
  }
}

void check_rotation(const TQSegment& g, const std::string& where);

void check_tensor(const TQTensorFormat& t, int head_dim, const char* role) {
  if (t.segments != 1 && t.segments != 2) {
    throw InvalidArgument(str_cat("TurboQuant ", role, " format: segments ", t.segments,
                                  " is invalid: allowed 1 (integer bits) or 2 (split codec)"));
  }
  if (t.norms_per_vector != t.segments) {
    throw InvalidArgument(str_cat("TurboQuant ", role, " format: norms_per_vector ",
                                  t.norms_per_vector, " must equal segments ", t.segments));
  }
  int dims = 0, bytes = 0;
  for (int s = 0; s < t.segments; ++s) {
    const TQSegment& g = t.seg[s];
    const std::string where = str_cat("TurboQuant ", role, " segment ", s, ": ");
    if (g.dim < 2) throw InvalidArgument(str_cat(where, "dim ", g.dim, " is invalid: need >= 2"));
    if (g.bits < 1 || g.bits > 8) {
      throw InvalidArgument(str_cat(where, "bits ", g.bits, " is invalid: allowed 1..8"));
    }
    if (g.code_offset != bytes) {
      throw InvalidArgument(str_cat(where, "code_offset ", g.code_offset, ", expected ", bytes,
                                    " (the segments' codes follow each other)"));
    }
    if (g.channel_offset != dims) {
      throw InvalidArgument(str_cat(where, "channel_offset ", g.channel_offset, ", expected ", dims,
                                    " (the dims of the segments before it)"));
    }
    if (g.norm_index != s) {
      throw InvalidArgument(str_cat(where, "norm_index ", g.norm_index, ", expected ", s));
    }
    check_rotation(g, where);
    if (g.centroids == nullptr || g.boundaries == nullptr) {
      throw InvalidArgument(str_cat(where, "centroids and boundaries are required"));
    }
    dims += g.dim;
    bytes += (g.dim * g.bits + 7) / 8;
  }
  if (dims != head_dim) {
    throw InvalidArgument(str_cat("TurboQuant ", role, " format: segment dims add up to ", dims,
                                  ", head_dim is ", head_dim));
  }
  if (t.code_bytes != bytes) {
    throw InvalidArgument(str_cat("TurboQuant ", role, " format: code_bytes ", t.code_bytes,
                                  ", the segments pack into ", bytes));
  }
}

void check_rotation(const TQSegment& g, const std::string& where) {
  if (g.hadamard) {
    if (!power_of_two(g.dim)) {
      throw InvalidArgument(
          str_cat(where, "a Hadamard rotation needs a power-of-two dim, got ", g.dim));
    }
    if (g.sign_words == nullptr || !(g.hadamard_scale > 0)) {
      throw InvalidArgument(str_cat(where,
                                    "a Hadamard rotation needs sign_words and a "
                                    "positive hadamard_scale, got scale ",
                                    g.hadamard_scale));
    }
  } else if (g.rotation == nullptr || g.rotation_t == nullptr) {
    throw InvalidArgument(str_cat(where, "a dense rotation needs rotation and rotation_t"));
  }
}

void check_uniform_tensor(const UniformTensorFormat& t, int head_dim, const char* role) {
  const std::string where = str_cat("uniform ", role, " format: ");
  if (t.bits < 2 || t.bits > 8) {
    throw InvalidArgument(str_cat(where, "bits ", t.bits, " is invalid: allowed 2..8"));
  }
  if (t.group_size != 32 && t.group_size != 64 && t.group_size != 128) {
    throw InvalidArgument(
        str_cat(where, "group_size ", t.group_size, " is invalid: allowed 32, 64, 128"));
  }
  if (t.code_bytes != (head_dim * t.bits + 7) / 8) {
    throw InvalidArgument(
        str_cat(where, "code_bytes ", t.code_bytes, ", expected ", (head_dim * t.bits + 7) / 8));
  }
  if (t.groups != (head_dim + t.group_size - 1) / t.group_size) {
    throw InvalidArgument(str_cat(where, "groups ", t.groups, ", expected ",
                                  (head_dim + t.group_size - 1) / t.group_size));
  }
}

size_t dense_elem_bytes(DenseElem e) {
  return e == DenseElem::kF32 ? 4 : 2;
}

// Sections one after another, each 16-B aligned.
BlockGeometry four_sections(size_t k, size_t v, size_t k_aux, size_t v_aux) {
  BlockGeometry g;
  g.k_offset = 0;
  g.v_offset = align16(k);
  g.k_aux_offset = k_aux > 0 ? g.v_offset + align16(v) : 0;
  g.v_aux_offset = k_aux > 0 ? g.k_aux_offset + align16(k_aux) : 0;
  g.block_bytes = k_aux > 0 ? g.v_aux_offset + align16(v_aux) : g.v_offset + align16(v);
  return g;
}

}  // namespace

void check_format(const DenseFormat& f) {
  if (f.elem != DenseElem::kF32 && f.elem != DenseElem::kF16 && f.elem != DenseElem::kBF16) {
    throw InvalidArgument(
        str_cat("dense format: element type ", int(f.elem), " is invalid: allowed f32, f16, bf16"));
  }
  check_kv_shape(f.kv_heads, f.head_dim, 1, "dense");
}

void check_format(const TQFormat& f) {
  check_kv_shape(f.kv_heads, f.head_dim, 2, "TurboQuant");
  check_tensor(f.key, f.head_dim, "key");
  check_tensor(f.value, f.head_dim, "value");
  if (f.sink_tokens < 0) {
    throw InvalidArgument(
        str_cat("TurboQuant format: sink_tokens ", f.sink_tokens, " must be >= 0"));
  }
  if (f.recent_tokens < 0) {
    throw InvalidArgument(
        str_cat("TurboQuant format: recent_tokens ", f.recent_tokens, " must be >= 0"));
  }
}

void check_format(const UniformFormat& f) {
  check_kv_shape(f.kv_heads, f.head_dim, 1, "uniform");
  check_uniform_tensor(f.key, f.head_dim, "key");
  check_uniform_tensor(f.value, f.head_dim, "value");
  if (f.rotated != 0 && f.rotated != 1) {
    throw InvalidArgument(str_cat("uniform format: rotated ", f.rotated, " must be 0 or 1"));
  }
  if (f.rotated) {
    for (const auto& [t, role] :
         {std::pair{&f.key_rotation, "key"}, std::pair{&f.value_rotation, "value"}}) {
      if (t->segments != 1 || t->seg[0].dim != f.head_dim || t->seg[0].channel_offset != 0) {
        throw InvalidArgument(str_cat("uniform format: the ", role,
                                      " rotation must be one segment over head_dim ", f.head_dim));
      }
      check_rotation(t->seg[0], str_cat("uniform format: ", role, " rotation: "));
    }
  }
}

// pointers: whether the device pointers are checked too (workspace sizing needs only shapes).
void check_batch(const PagedBatch& b, const char* what, bool pointers) {
  if (b.batch < 1 || b.batch > 65535) {
    throw InvalidArgument(str_cat(what, ": batch ", b.batch, " is invalid: allowed 1..65535"));
  }
  if (pointers && (b.block_table == nullptr || b.seq_len == nullptr)) {
    throw InvalidArgument(str_cat(what, ": block_table and seq_len are required"));
  }
  if (b.table_stride < 1) {
    throw InvalidArgument(str_cat(what, ": table_stride ", b.table_stride, " must be >= 1"));
  }
  if (b.max_len < 0 || int64_t(b.max_len) > int64_t(b.table_stride) * kBlockTokens) {
    throw InvalidArgument(str_cat(what, ": max_len ", b.max_len, " is invalid: allowed 0..",
                                  int64_t(b.table_stride) * kBlockTokens,
                                  " (table_stride * kBlockTokens)"));
  }
}

SplitPlan plan_splits(const PagedBatch& b, const QueryRows& q, const AttentionOptions& o,
                      int kv_heads, int head_dim, int sms) {
  if (o.n_heads < kv_heads || kv_heads < 1 || o.n_heads % kv_heads != 0) {
    throw InvalidArgument(str_cat("paged attention: n_heads ", o.n_heads,
                                  " must be a positive multiple of kv_heads ", kv_heads));
  }
  if (q.max_n_q < 0) {
    throw InvalidArgument(str_cat("paged attention: max_n_q ", q.max_n_q, " must be >= 0"));
  }
  if (o.splits < 0) {
    throw InvalidArgument(str_cat("paged attention: splits ", o.splits, " must be >= 0"));
  }
  if (o.split_tokens < 0 || o.split_tokens % kSplitChunk != 0) {
    throw InvalidArgument(str_cat("paged attention: split_tokens ", o.split_tokens,
                                  " must be 0 or a positive multiple of ", kSplitChunk));
  }
  SplitPlan p;
  p.group = o.n_heads / kv_heads;
  const int64_t row_groups = ceil_div(int64_t(q.max_n_q) * p.group, kRows);
  const int64_t chunks = std::max<int64_t>(1, ceil_div(b.max_len, kSplitChunk));
  int64_t want = o.splits;
  if (want == 0) {
    const int64_t base = std::max<int64_t>(1, int64_t(b.batch) * kv_heads * row_groups);
    want = ceil_div(4 * int64_t(std::max(sms, 1)), base);
  }
  want = std::clamp<int64_t>(want, 1, std::min<int64_t>(chunks, kMaxSplits));
  const int64_t chunks_per_split =
      o.split_tokens > 0
          ? std::max<int64_t>(o.split_tokens / kSplitChunk, ceil_div(chunks, kMaxSplits))
          : ceil_div(chunks, want);
  p.split_tokens = int(chunks_per_split * kSplitChunk);
  p.splits = int(ceil_div(chunks, chunks_per_split));
  if (row_groups * p.splits > int64_t(0x7fffffff)) {
    throw InvalidArgument(str_cat("paged attention: ", row_groups, " row groups x ", p.splits,
                                  " splits exceed the grid; max_n_q ", q.max_n_q, " is too large"));
  }
  if (int64_t(q.max_n_q) * o.n_heads > int64_t(0x7fffffff)) {
    throw InvalidArgument(str_cat("paged attention: max_n_q ", q.max_n_q, " x n_heads ", o.n_heads,
                                  " rows exceed the merge grid"));
  }
  p.row_groups = int(row_groups);
  p.partials = size_t(b.batch) * size_t(q.max_n_q) * size_t(o.n_heads) * size_t(p.splits);
  p.acc_bytes = round_up(p.partials * size_t(head_dim) * sizeof(float), 256);
  p.workspace = p.acc_bytes + p.partials * sizeof(float2);
  return p;
}

StagePlan plan_stages(const BlockGeometry& g, const int (&row_bytes)[kRegions], int head_dim) {
  StagePlan s;
  const size_t offsets[kRegions] = {g.k_offset, g.v_offset, g.k_aux_offset, g.v_aux_offset};
  int offset = 0;
  for (int i = 0; i < kRegions; ++i) {
    StageRegion& r = s.region[i];
    r.row_bytes = row_bytes[i];
    r.section_offset = int(offsets[i]);
    r.smem_offset = offset;
    if (r.row_bytes == 0) continue;
    const int rb = r.row_bytes;
    r.unit = rb % 16 == 0 ? 16 : rb % 8 == 0 ? 8 : rb % 4 == 0 ? 4 : 0;
    r.smem_stride = r.unit == 0 || (rb / r.unit) % 2 == 1 ? rb : rb + r.unit;
    offset = int(align16(size_t(offset) + size_t(kTileTokens) * r.smem_stride));
  }
  s.stage_bytes = offset;
  while (s.warps * s.stages * s.stage_bytes > kStageBudget && (s.stages > 1 || s.warps > 1)) {
    if (s.stages > 1) {
      s.stages = 1;
    } else {
      s.warps /= 2;
    }
  }
  const int staging = s.warps * s.stages * s.stage_bytes;
  const int combine = s.warps * kRows * (head_dim + 2) * int(sizeof(float));
  const int prologue = s.warps * 2 * kMaxHeadDim * int(sizeof(float));
  s.smem_bytes = std::max({staging, combine, prologue});
  if (s.smem_bytes > kMaxDynamicSmem) {
    throw Unsupported(str_cat("paged attention: a tile needs ", s.smem_bytes,
                              " B of shared memory, more than ", kMaxDynamicSmem));
  }
  return s;
}

AttnArgs make_attention_args(const PagedBatch& b, const QueryRows& q, const AttentionOptions& o,
                             int kv_heads, int head_dim, const StagePlan& stage, void* workspace,
                             size_t workspace_bytes, MergeArgs* merge) {
  if (q.q == nullptr || q.out == nullptr || q.q_start == nullptr) {
    throw InvalidArgument("paged attention: q, out and q_start are required");
  }
  if (!(o.scale > 0) || !std::isfinite(o.scale)) {
    throw InvalidArgument(str_cat("paged attention: scale ", o.scale, " must be finite and > 0"));
  }
  if (!(o.logit_softcap >= 0) || !std::isfinite(o.logit_softcap)) {
    throw InvalidArgument(
        str_cat("paged attention: logit_softcap ", o.logit_softcap, " must be finite and >= 0"));
  }
  if (o.sliding_window < 0) {
    throw InvalidArgument(
        str_cat("paged attention: sliding_window ", o.sliding_window, " must be >= 0"));
  }
  const SplitPlan p = plan_splits(b, q, o, kv_heads, head_dim, sm_count());
  if (workspace == nullptr || workspace_bytes < p.workspace) {
    throw InvalidArgument(str_cat("paged attention: workspace of ", workspace_bytes, " B, need ",
                                  p.workspace, " B (paged_attention_workspace_bytes)"));
  }
  AttnArgs a;
  a.table = b.block_table;
  a.table_stride = b.table_stride;
  a.table_tokens = b.table_stride * kBlockTokens;
  a.seq_len = b.seq_len;
  a.batch = b.batch;
  a.q = q.q;
  a.q_start = q.q_start;
  a.max_n_q = q.max_n_q;
  a.n_heads = o.n_heads;
  a.kv_heads = kv_heads;
  a.group = p.group;
  a.head_dim = head_dim;
  a.row_groups = p.row_groups;
  a.splits = p.splits;
  a.split_tokens = p.split_tokens;
  a.scale = o.scale;
  a.softcap = o.logit_softcap;
  a.window = o.sliding_window;
  a.part_acc = static_cast<float*>(workspace);
  a.part_ml = reinterpret_cast<float2*>(static_cast<char*>(workspace) + p.acc_bytes);
  a.stage = stage;
  merge->seq_len = b.seq_len;
  merge->q_start = q.q_start;
  merge->out = q.out;
  merge->lse = q.lse;
  merge->part_acc = a.part_acc;
  merge->part_ml = a.part_ml;
  merge->table_tokens = a.table_tokens;
  merge->max_n_q = q.max_n_q;
  merge->n_heads = o.n_heads;
  merge->group = p.group;
  merge->head_dim = head_dim;
  merge->splits = p.splits;
  merge->split_tokens = p.split_tokens;
  return a;
}

}  // namespace paged

using namespace paged;

BlockGeometry block_geometry(const DenseFormat& f) {
  check_format(f);
  const size_t section = size_t(f.kv_heads) * kBlockTokens * f.head_dim * dense_elem_bytes(f.elem);
  return four_sections(section, section, 0, 0);
}

BlockGeometry block_geometry(const TQFormat& f) {
  check_format(f);
  const size_t rows = size_t(f.kv_heads) * kBlockTokens;
  return four_sections(rows * f.key.code_bytes, rows * f.value.code_bytes,
                       rows * f.key.norms_per_vector * 2, rows * f.value.norms_per_vector * 2);
}

BlockGeometry block_geometry(const UniformFormat& f) {
  check_format(f);
  const size_t rows = size_t(f.kv_heads) * kBlockTokens;
  return four_sections(rows * f.key.code_bytes, rows * f.value.code_bytes, rows * f.key.groups * 4,
                       rows * f.value.groups * 4);
}

BlockGeometry block_geometry_tq35(int kv_heads) {
  if (kv_heads < 1 || kv_heads > 65535) {
    throw InvalidArgument(
        str_cat("TurboQuant 3.5 format: kv_heads ", kv_heads, " is invalid: allowed 1..65535"));
  }
  constexpr size_t kTileBytes = 3712;  // tq_layout.h TQ35Layout::kTileBytes
  BlockGeometry g;
  g.block_bytes = size_t(kv_heads) * (kBlockTokens / 32) * kTileBytes;
  return g;
}

size_t paged_attention_workspace_bytes(const PagedBatch& batch, const QueryRows& queries,
                                       const AttentionOptions& options, int kv_heads,
                                       int head_dim) {
  check_batch(batch, "paged attention", /*pointers=*/false);
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    throw InvalidArgument(
        str_cat("paged attention: head_dim ", head_dim, " is invalid: allowed 1..", kMaxHeadDim));
  }
  return plan_splits(batch, queries, options, kv_heads, head_dim, sm_count()).workspace;
}

namespace {

// Bytes of the coded part's log-sum-exp rows that the sink pass reads.
size_t sink_lse_bytes(const TQFormat& f, const PagedBatch& batch, const QueryRows& queries,
                      const AttentionOptions& options) {
  if (f.sink_tokens == 0 && f.recent_tokens == 0) return 0;
  return round_up(
      size_t(batch.batch) * size_t(queries.max_n_q) * size_t(options.n_heads) * sizeof(float), 256);
}

}  // namespace

size_t paged_attention_workspace_bytes(const TQFormat& f, const PagedBatch& batch,
                                       const QueryRows& queries, const AttentionOptions& options) {
  check_format(f);
  return round_up(paged_attention_workspace_bytes(batch, queries, options, f.kv_heads, f.head_dim),
                  256) +
         sink_lse_bytes(f, batch, queries, options);
}

namespace {

// Runs the split pass through `launch` and then the merge; nothing to do without queries.
// key_begin: keys below it are not attended (sink tokens); recent: a query at p attends keys
// below p + 1 - recent only. Returns the split pass's arguments.
template <typename Launch>
AttnArgs run_attention(const BlockGeometry& g, const int (&row_bytes)[kRegions], int kv_heads,
                       int head_dim, const PagedBatch& b, const QueryRows& q,
                       const AttentionOptions& o, void* workspace, size_t workspace_bytes,
                       const TQFormat* unrotate, const TQSequenceState* states, cudaStream_t stream,
                       Launch launch, int key_begin = 0, int recent = 0) {
  check_batch(b, "paged attention");
  if (q.max_n_q == 0) return AttnArgs{};
  const StagePlan stage = plan_stages(g, row_bytes, head_dim);
  MergeArgs merge;
  AttnArgs a =
      make_attention_args(b, q, o, kv_heads, head_dim, stage, workspace, workspace_bytes, &merge);
  a.key_begin = key_begin;
  a.recent = recent;
  merge.states = states;
  launch(a);
  launch_merge(merge, unrotate, b.batch, stream);
  return a;
}

}  // namespace

void paged_attention(const DenseFormat& f, const PagedBatch& b, const QueryRows& q,
                     const AttentionOptions& o, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) {
  const BlockGeometry g = block_geometry(f);
  const int row = f.head_dim * int(dense_elem_bytes(f.elem));
  const int row_bytes[kRegions] = {row, row, 0, 0};
  run_attention(g, row_bytes, f.kv_heads, f.head_dim, b, q, o, workspace, workspace_bytes, nullptr,
                nullptr, stream, [&](const AttnArgs& a) { launch_dense_attention(a, f, stream); });
}

void paged_attention(const UniformFormat& f, const PagedBatch& b, const QueryRows& q,
                     const AttentionOptions& o, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) {
  const BlockGeometry g = block_geometry(f);
  const int row_bytes[kRegions] = {f.key.code_bytes, f.value.code_bytes, f.key.groups * 4,
                                   f.value.groups * 4};
  // Rotated groups: the merge takes the rows back through the values' rotation.
  TQFormat unrotate;
  unrotate.kv_heads = f.kv_heads;
  unrotate.head_dim = f.head_dim;
  unrotate.value = f.value_rotation;
  run_attention(g, row_bytes, f.kv_heads, f.head_dim, b, q, o, workspace, workspace_bytes,
                f.rotated ? &unrotate : nullptr, nullptr, stream,
                [&](const AttnArgs& a) { launch_uniform_attention(a, f, stream); });
}

void paged_attention(const TQFormat& f, const PagedBatch& b, const TQSequenceState* states,
                     const QueryRows& q, const AttentionOptions& o, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream) {
  const BlockGeometry g = block_geometry(f);
  const int row_bytes[kRegions] = {f.key.code_bytes, f.value.code_bytes, f.key.norms_per_vector * 2,
                                   f.value.norms_per_vector * 2};
  QueryRows coded = q;
  size_t coded_workspace = workspace_bytes;
  const bool dense_rows = f.sink_tokens > 0 || f.recent_tokens > 0;
  if (dense_rows && q.max_n_q > 0) {
    // The coded part's log-sum-exp rows go to the end of the workspace.
    const size_t need = paged_attention_workspace_bytes(f, b, q, o);
    if (workspace == nullptr || workspace_bytes < need) {
      throw InvalidArgument(str_cat("paged attention: workspace of ", workspace_bytes, " B, need ",
                                    need, " B (paged_attention_workspace_bytes of the format)"));
    }
    if (states == nullptr) {
      throw InvalidArgument(
          "paged attention: a format with sink or recent tokens needs the states");
    }
    if (f.recent_tokens > 0 && (q.k_new == nullptr || q.v_new == nullptr)) {
      throw InvalidArgument("paged attention: a format with recent tokens needs k_new and v_new");
    }
    const size_t lse_bytes = sink_lse_bytes(f, b, q, o);
    coded_workspace = need - lse_bytes;
    if (coded.lse == nullptr) {
      coded.lse = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + coded_workspace);
    }
  }
  const AttnArgs a = run_attention(
      g, row_bytes, f.kv_heads, f.head_dim, b, coded, o, workspace, coded_workspace, &f, states,
      stream,
      [&](const AttnArgs& args) {
        bool done = false;
        if (f.head_dim == 64) done = launch_tq_attention_d64(args, f, states, stream);
        if (f.head_dim == 128) done = launch_tq_attention_d128(args, f, states, stream);
        if (f.head_dim == 256) done = launch_tq_attention_d256(args, f, states, stream);
        if (!done) launch_tq_attention_generic(args, f, states, stream);
      },
      f.sink_tokens, f.recent_tokens);
  if (!dense_rows || q.max_n_q == 0) return;
  SinkArgs s;
  s.states = states;
  s.seq_len = b.seq_len;
  s.q_start = q.q_start;
  s.q = q.q;
  s.out = q.out;
  s.lse = coded.lse;
  s.table_tokens = a.table_tokens;
  s.max_n_q = q.max_n_q;
  s.n_heads = o.n_heads;
  s.group = a.group;
  s.head_dim = f.head_dim;
  s.sink_tokens = f.sink_tokens;
  s.recent_tokens = f.recent_tokens;
  s.kv_heads = f.kv_heads;
  s.k_new = q.k_new;
  s.v_new = q.v_new;
  s.scale = o.scale;
  s.softcap = o.logit_softcap;
  s.window = o.sliding_window;
  launch_sink_merge(s, b.batch, stream);
}

void paged_recent_update(const TQFormat& f, const PagedBatch& b, const TQSequenceState* states,
                         const QueryRows& q, cudaStream_t stream) {
  check_format(f);
  check_batch(b, "paged recent update");
  if (f.recent_tokens <= 1 || q.max_n_q <= 0) return;
  if (states == nullptr || q.k_new == nullptr || q.v_new == nullptr || q.q_start == nullptr) {
    throw InvalidArgument("paged recent update: states, k_new, v_new and q_start are required");
  }
  RecentArgs r;
  r.states = states;
  r.seq_len = b.seq_len;
  r.q_start = q.q_start;
  r.k_new = q.k_new;
  r.v_new = q.v_new;
  r.table_tokens = b.table_stride * kBlockTokens;
  r.max_n_q = q.max_n_q;
  r.kv_heads = f.kv_heads;
  r.head_dim = f.head_dim;
  r.sink_tokens = f.sink_tokens;
  r.recent_tokens = f.recent_tokens;
  launch_recent_update(r, b.batch, stream);
}

}  // namespace turbokv::cuda
