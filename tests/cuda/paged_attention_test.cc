// paged_attention against kernels/cpu attention_reference over the same cache contents: the
// blocks are written on the host by the CPU codecs (so these tests do not depend on
// paged_append), and the reference attends over the CPU codecs' dequantized vectors (+ the mean
// where centered), so the codes' own error is excluded and what remains is float rounding.
//
// Tolerance: max over rows of |out - ref| / |ref| <= 1e-4. Both sides accumulate in fp32 (the
// reference sequentially, the kernel per lane and split, then merged); with these sizes
// (<= 20k keys, head_dim <= 256, scores of order 1-10) the rounding differences measured are of
// order 1e-6, while an indexing, masking or merging mistake (one key too many or too few, a
// wrong norm, a wrong rotation) moves a row by 1e-3 or more.
//
// Every call also checks: the rows' log-sum-exp (against a double-precision one of the same
// scores), no NaN/Inf in the output, guard rows around the outputs and a guard band after the
// workspace untouched, the cache pool unchanged (attention only reads), the
// workspace pre-filled with NaN (no zero-fill needed), garbage (0xFF bytes: NaN norms and
// elements) in every unwritten token of the blocks, and the same result for several split
// counts.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/kvcache/plan.h"
#include "kv/turboquant_kv_cache.h"
#include "kv/uniform_kv_cache.h"
#include "paged_util.h"
#include "test_util.h"

namespace turbokv::cuda {
namespace {

using testing::BlockPool;
using testing::FormatKind;
using testing::FormatSpec;
using testing::PagedCodec;

constexpr double kTolerance = 1e-4;
constexpr double kSplitTolerance = 2e-5;  // between split counts: only the merge order differs
constexpr int kGuardRows = 2;

struct Seq {
  int len;
  int n_q;
};

struct Case {
  FormatSpec spec;
  std::vector<Seq> seqs;
  int n_heads = 8;
  float scale = 0;  // 0: 1 / sqrt(head_dim)
  float softcap = 0;
  int window = 0;
  int extra_len = 0;  // max_len above the longest sequence (a captured graph's capacity)
  int extra_q = 0;    // max_n_q above the most queries
  std::vector<int> splits = {0};
};

std::string describe(const Case& c) {
  std::ostringstream o;
  o << testing::describe(c.spec) << ", n_heads " << c.n_heads << ", seqs (len/n_q)";
  for (const Seq& s : c.seqs) o << " " << s.len << "/" << s.n_q;
  if (c.scale > 0) o << ", scale " << c.scale;
  if (c.softcap > 0) o << ", softcap " << c.softcap;
  if (c.window > 0) o << ", window " << c.window;
  if (c.extra_len > 0) o << ", max_len +" << c.extra_len;
  if (c.extra_q > 0) o << ", max_n_q +" << c.extra_q;
  return o.str();
}

// Row r of [rows, n_heads, d] as "query row i, head h" for messages.
std::string row_name(size_t r, int n_heads) {
  return str_cat("query row ", r / n_heads, " head ", r % n_heads);
}

// Worst row of out vs ref (rows of d floats): relative error and which row.
std::pair<double, size_t> worst_row(const std::vector<float>& out, const std::vector<float>& ref,
                                    int d) {
  double worst = 0;
  size_t at = 0;
  for (size_t r = 0; r * d < ref.size(); ++r) {
    double diff = 0, norm = 0;
    for (int j = 0; j < d; ++j) {
      const double e = double(out[r * d + j]) - ref[r * d + j];
      diff += e * e;
      norm += double(ref[r * d + j]) * ref[r * d + j];
    }
    const double err = std::sqrt(diff / std::max(norm, 1e-30));
    if (!(err <= worst)) {  // NaN wins
      worst = err;
      at = r;
      if (std::isnan(err)) break;
    }
  }
  return {worst, at};
}

void check_attention(const Case& c) {
  SCOPED_TRACE(describe(c));
  const PagedCodec codec(c.spec, int(c.seqs.size()));
  const int kv = c.spec.kv_heads, d = c.spec.head_dim, heads = c.n_heads;
  const int batch = int(c.seqs.size());
  std::vector<int> blocks(batch), lens(batch), q_start(batch + 1, 0);
  int max_blocks = 0, max_len = 0, max_n_q = 0;
  for (int b = 0; b < batch; ++b) {
    lens[b] = c.seqs[b].len;
    blocks[b] = (lens[b] + kBlockTokens - 1) / kBlockTokens;
    max_blocks = std::max(max_blocks, blocks[b]);
    max_len = std::max(max_len, lens[b]);
    max_n_q = std::max(max_n_q, c.seqs[b].n_q);
    q_start[b + 1] = q_start[b] + c.seqs[b].n_q;
  }
  max_len += c.extra_len;
  max_n_q += c.extra_q;
  const int stride = (max_len + kBlockTokens - 1) / kBlockTokens + 1;  // >= 1 zero-block entry
  BlockPool pool(codec.geometry().block_bytes, blocks, stride, c.spec.seed + 1, 0xFF);

  // Keys with a per-head offset (a peakier softmax), values N(0, 2); written into the blocks and
  // read back as the reference's dense [kv_heads, len, d] f32 per sequence.
  std::vector<std::vector<float>> k_hat(batch), v_hat(batch);
  for (int b = 0; b < batch; ++b) {
    const size_t n = size_t(lens[b]) * kv * d;
    std::vector<float> k = testing::random_normal(n, c.spec.seed * 31 + b);
    const std::vector<float> v = testing::random_normal(n, c.spec.seed * 37 + b, 2.0f);
    const std::vector<float> bias = testing::random_normal(size_t(kv) * d, c.spec.seed + 2, 0.5f);
    k_hat[b].resize(n);
    v_hat[b].resize(n);
    for (int t = 0; t < lens[b]; ++t) {
      uint8_t* block = pool.host_block(b, t / kBlockTokens);
      for (int h = 0; h < kv; ++h) {
        float* kx = &k[(size_t(t) * kv + h) * d];
        for (int j = 0; j < d; ++j) kx[j] += bias[size_t(h) * d + j];
        codec.encode(0, b, h, kx, t % kBlockTokens, block);
        codec.encode(1, b, h, &v[(size_t(t) * kv + h) * d], t % kBlockTokens, block);
        codec.decode(0, b, h, block, t % kBlockTokens, &k_hat[b][(size_t(h) * lens[b] + t) * d]);
        codec.decode(1, b, h, block, t % kBlockTokens, &v_hat[b][(size_t(h) * lens[b] + t) * d]);
      }
    }
  }
  pool.upload();

  const int rows = q_start[batch];
  const std::vector<float> q = testing::random_normal(size_t(rows) * heads * d, c.spec.seed + 3);
  AttentionParams params;
  params.n_heads = heads;
  params.scale = c.scale > 0 ? c.scale : 1.0f / std::sqrt(float(d));
  params.logit_softcap = c.softcap;
  params.sliding_window = c.window;
  std::vector<float> ref(q.size(), 0.0f);
  for (int b = 0; b < batch; ++b) {
    if (c.seqs[b].n_q == 0) continue;
    DenseKVView view;
    view.dtype = KVDType::kF32;
    view.k = k_hat[b].data();
    view.v = v_hat[b].data();
    view.kv_heads = kv;
    view.head_dim = d;
    view.head_stride = lens[b];
    view.n_tokens = lens[b];
    const size_t first = size_t(q_start[b]) * heads * d;
    attention_reference(
        view, AttentionQueries{q.data() + first, c.seqs[b].n_q, int64_t(lens[b]) - c.seqs[b].n_q},
        params, ref.data() + first);
  }

  // The rows' log-sum-exp of the same scores, in double.
  std::vector<double> ref_lse(size_t(rows) * heads);
  for (int b = 0; b < batch; ++b) {
    const int n_q = c.seqs[b].n_q, len = lens[b];
    for (int i = 0; i < n_q; ++i) {
      const int pos = len - n_q + i;
      for (int h = 0; h < heads; ++h) {
        const float* qv = &q[(size_t(q_start[b] + i) * heads + h) * d];
        const int kv_head = h / (heads / kv);
        std::vector<double> s;
        for (int t = 0; t < len; ++t) {
          if (!attention_visible(pos, t, c.window)) continue;
          const float* kx = &k_hat[b][(size_t(kv_head) * len + t) * d];
          double dot = 0;
          for (int j = 0; j < d; ++j) dot += double(qv[j]) * kx[j];
          double z = params.scale * dot;
          if (c.softcap > 0) z = c.softcap * std::tanh(z / c.softcap);
          s.push_back(z);
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double z : s) sum += std::exp(z - m);
        ref_lse[size_t(q_start[b] + i) * heads + h] = m + std::log(sum);
      }
    }
  }

  auto d_q = DeviceBuffer<float>::upload(q);
  auto d_len = DeviceBuffer<int>::upload(lens);
  auto d_start = DeviceBuffer<int>::upload(q_start);
  const size_t row_floats = size_t(heads) * d;
  DeviceBuffer<float> d_out((rows + 2 * kGuardRows) * row_floats);
  DeviceBuffer<float> d_lse((rows + 2 * kGuardRows) * heads);
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const PagedBatch paged = pool.paged_batch(d_len.data(), max_len);
  QueryRows queries;
  queries.q = d_q.data();
  queries.out = d_out.data() + kGuardRows * row_floats;
  queries.q_start = d_start.data();
  queries.max_n_q = max_n_q;
  queries.lse = d_lse.data() + kGuardRows * heads;

  std::vector<std::vector<float>> outputs;
  for (int splits : c.splits) {
    SCOPED_TRACE(str_cat("splits ", splits == 0 ? std::string("planned") : std::to_string(splits)));
    AttentionOptions o;
    o.n_heads = heads;
    o.scale = params.scale;
    o.logit_softcap = c.softcap;
    o.sliding_window = c.window;
    o.splits = splits;
    const size_t ws_bytes = paged_attention_workspace_bytes(paged, queries, o, kv, d);
    DeviceBuffer<uint8_t> workspace(ws_bytes + BlockPool::kGuard);
    TURBOKV_CUDA_CHECK(cudaMemset(workspace.data(), 0xFF, ws_bytes));  // NaN partials
    TURBOKV_CUDA_CHECK(cudaMemset(workspace.data() + ws_bytes, 0x5A, BlockPool::kGuard));
    TURBOKV_CUDA_CHECK(cudaMemset(d_out.data(), 0xFF, d_out.bytes()));
    TURBOKV_CUDA_CHECK(cudaMemset(d_lse.data(), 0xFF, d_lse.bytes()));
    TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    codec.attention(paged, queries, o, workspace.data(), ws_bytes, stream);
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));

    const std::vector<float> all = d_out.download();
    const std::vector<uint8_t> ws = workspace.download();
    for (size_t i = ws_bytes; i < ws.size(); ++i) {
      ASSERT_EQ(ws[i], 0x5A) << "workspace guard byte " << i - ws_bytes << " overwritten";
    }
    std::vector<uint32_t> bits(all.size());
    std::memcpy(bits.data(), all.data(), 4 * all.size());
    for (size_t i = 0; i < kGuardRows * row_floats; ++i) {
      ASSERT_EQ(bits[i], 0xFFFFFFFFu) << "guard row before the output overwritten at " << i;
      ASSERT_EQ(bits[bits.size() - 1 - i], 0xFFFFFFFFu)
          << "guard row after the output overwritten at " << i;
    }
    std::vector<float> out(all.begin() + kGuardRows * row_floats,
                           all.end() - kGuardRows * row_floats);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_TRUE(std::isfinite(out[i]))
          << "output " << out[i] << " at " << row_name(i / d, heads) << " dim " << i % d;
    }
    const std::vector<float> lse_all = d_lse.download();
    for (size_t i = 0; i < size_t(kGuardRows) * heads; ++i) {
      ASSERT_TRUE(std::isnan(lse_all[i]) && std::isnan(lse_all[lse_all.size() - 1 - i]))
          << "guard entry " << i << " around the log-sum-exp output overwritten";
    }
    double lse_err = 0;
    for (size_t i = 0; i < ref_lse.size(); ++i) {
      const float got = lse_all[kGuardRows * heads + i];
      const double e = std::abs(got - ref_lse[i]) / std::max(1.0, std::abs(ref_lse[i]));
      ASSERT_LE(e, kTolerance) << "log-sum-exp of " << row_name(i, heads) << ": got " << got
                               << ", expected " << ref_lse[i];
      lse_err = std::max(lse_err, e);
    }
    const auto [err, row] = worst_row(out, ref, d);
    std::printf("  %s, splits %d: max row relative error %.2e, log-sum-exp %.2e\n",
                describe(c).c_str(), splits, err, lse_err);
    EXPECT_LE(err, kTolerance) << "worst at " << row_name(row, heads) << ": got " << out[row * d]
                               << ", " << out[row * d + 1] << " ... expected " << ref[row * d]
                               << ", " << ref[row * d + 1] << " ...";
    outputs.push_back(std::move(out));
  }
  for (size_t i = 1; i < outputs.size(); ++i) {
    const auto [diff, row] = worst_row(outputs[i], outputs[0], d);
    EXPECT_LE(diff, kSplitTolerance) << "splits " << c.splits[i] << " vs " << c.splits[0]
                                     << " differ by " << diff << " at " << row_name(row, heads);
  }
  const std::vector<uint8_t> after = pool.download();
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(after[i], pool.image()[i])
        << "attention wrote to the cache pool at " << pool.locate(i);
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

FormatSpec turboquant(double key_bits, double value_bits, int d, uint64_t seed, int kv = 2) {
  FormatSpec s;
  s.kind = FormatKind::kTurboQuant;
  s.key_bits = key_bits;
  s.value_bits = value_bits;
  s.head_dim = d;
  s.kv_heads = kv;
  s.seed = seed;
  return s;
}

FormatSpec uniform(int key_bits, int value_bits, int group, int d, uint64_t seed) {
  FormatSpec s;
  s.kind = FormatKind::kUniform;
  s.key_bits = key_bits;
  s.value_bits = value_bits;
  s.group_size = group;
  s.head_dim = d;
  s.seed = seed;
  return s;
}

FormatSpec dense(DenseElem e, int d, uint64_t seed, int kv = 2) {
  FormatSpec s;
  s.kind = FormatKind::kDense;
  s.elem = e;
  s.head_dim = d;
  s.kv_heads = kv;
  s.seed = seed;
  return s;
}

// A decode + prefill varlen batch: lengths off the 32 / 256 grid, a one-token sequence.
const std::vector<Seq> kMixed = {{1, 1}, {300, 1}, {513, 4}};

class CudaPagedAttention : public testing::CudaTest {};

// Every compile-time kernel (single-segment codecs, key and value bits 2..4, d 64 / 128 / 256).
TEST_F(CudaPagedAttention, CompileTimeTurboQuantKernels) {
  uint64_t seed = 1000;
  for (int d : {64, 128, 256}) {
    for (int kb = 2; kb <= 4; ++kb) {
      for (int vb = 2; vb <= 4; ++vb) check_attention({turboquant(kb, vb, d, seed++), kMixed});
    }
  }
}

// Split codecs, dense rotations (d not a power of two), bits outside 2..4, other head_dims.
TEST_F(CudaPagedAttention, GenericTurboQuantKernel) {
  check_attention({turboquant(2.5, 3.5, 128, 1100), kMixed});
  check_attention({turboquant(3.5, 1.5, 80, 1101), kMixed});
  check_attention({turboquant(1, 8, 128, 1102), kMixed});
  check_attention({turboquant(3, 4, 96, 1103), kMixed});
  check_attention({turboquant(5, 6, 256, 1104), kMixed});
  check_attention({turboquant(4.5, 2, 32, 1105), kMixed});
  check_attention({turboquant(2, 3, 2, 1106), kMixed});  // the smallest head_dim
}

// Centering: the value mean is added back, the key mean's score term matters under a soft-cap.
TEST_F(CudaPagedAttention, CenteredTurboQuant) {
  for (FormatSpec s : {turboquant(3, 4, 128, 1200), turboquant(2.5, 3, 96, 1201)}) {
    s.center = true;
    Case c{s, kMixed};
    check_attention(c);
    c.scale = 0.4f;
    c.softcap = 8.0f;
    check_attention(c);
  }
  FormatSpec s = turboquant(4, 4, 64, 1202);
  s.center = true;
  s.norm_correction = false;
  check_attention({s, {{700, 3}, {64, 64}}});
}

TEST_F(CudaPagedAttention, Uniform) {
  check_attention({uniform(4, 4, 64, 128, 1300), kMixed});
  check_attention({uniform(2, 8, 32, 80, 1301), kMixed});
  check_attention({uniform(8, 3, 128, 256, 1302), kMixed});
  check_attention({uniform(3, 5, 64, 96, 1303), {{1000, 2}, {77, 7}}});
}

TEST_F(CudaPagedAttention, Dense) {
  check_attention({dense(DenseElem::kF32, 128, 1400), kMixed});
  check_attention({dense(DenseElem::kF16, 64, 1401), kMixed});
  check_attention({dense(DenseElem::kBF16, 256, 1402), kMixed});
  check_attention({dense(DenseElem::kF32, 80, 1403), {{1000, 2}, {77, 7}}});
  check_attention({dense(DenseElem::kF32, 256, 1404), {{600, 3}}});  // the one-warp stage plan
}

// The same features through the dense f32, the compile-time and the generic TurboQuant kernels.
std::vector<FormatSpec> feature_formats(uint64_t seed) {
  return {dense(DenseElem::kF32, 128, seed), turboquant(3, 4, 128, seed + 1),
          turboquant(2.5, 3.5, 96, seed + 2)};
}

TEST_F(CudaPagedAttention, GqaGroups) {
  for (const FormatSpec& s : feature_formats(1500)) {
    for (int group : {1, 2, 4, 8, 16}) {
      check_attention({s, {{1000, 1}, {37, 1}, {256, 2}}, 2 * group});
    }
  }
}

TEST_F(CudaPagedAttention, PrefillIsCausalWithVarlenQueries) {
  for (const FormatSpec& s : feature_formats(1600)) {
    check_attention({s, {{100, 100}, {300, 17}, {40, 1}}, 4});
    // Lengths around the tile and block sizes; a sequence without queries.
    check_attention({s, {{1, 1}, {31, 5}, {33, 33}, {255, 0}, {257, 3}, {700, 9}}, 4});
  }
}

TEST_F(CudaPagedAttention, SlidingWindow) {
  for (const FormatSpec& s : feature_formats(1700)) {
    Case c{s, {{1200, 1}, {900, 40}, {50, 50}}, 4};
    c.window = 64;
    check_attention(c);
    c.window = 1;  // every query sees its own key only
    check_attention(c);
    c.window = 300;
    c.splits = {0, 1, 9};
    check_attention(c);
  }
}

TEST_F(CudaPagedAttention, SoftcapAndScale) {
  for (const FormatSpec& s : feature_formats(1800)) {
    Case c{s, kMixed};
    c.scale = 0.5f;
    c.softcap = 5.0f;
    check_attention(c);
    c.softcap = 0;
    c.scale = 0.02f;
    check_attention(c);
  }
}

// A captured graph's bounds: max_len and max_n_q above what the sequences hold.
TEST_F(CudaPagedAttention, CapacityAboveTheBatch) {
  for (const FormatSpec& s : feature_formats(1900)) {
    Case c{s, {{700, 2}, {5, 1}}};
    c.extra_len = 1400;
    c.extra_q = 5;
    check_attention(c);
  }
}

TEST_F(CudaPagedAttention, SplitCountDoesNotChangeTheResult) {
  for (const FormatSpec& s : feature_formats(2000)) {
    Case c{s, {{3000, 2}, {1500, 1}, {129, 3}}};
    c.splits = {1, 2, 3, 7, 24, 0};
    check_attention(c);
  }
}

TEST_F(CudaPagedAttention, LongContextManySplits) {
  check_attention({turboquant(3, 4, 128, 2100, 4), {{12000, 1}, {5000, 1}}, 16});
  check_attention({dense(DenseElem::kF16, 128, 2101, 4), {{12000, 1}}, 16});
}

// Host-side checks (no GPU needed): the plan's invariants and the argument checks.
TEST(CudaPagedAttentionPlan, SplitsCoverTheKeysInChunks) {
  for (int max_len : {0, 1, 127, 128, 129, 5000, 131072}) {
    for (int want : {0, 1, 3, 1000}) {
      PagedBatch b;
      b.batch = 2;
      b.max_len = max_len;
      b.table_stride = (max_len + kBlockTokens - 1) / kBlockTokens + 1;
      QueryRows q;
      q.max_n_q = 3;
      AttentionOptions o;
      o.n_heads = 8;
      o.splits = want;
      const paged::SplitPlan p = paged::plan_splits(b, q, o, 2, 128, 132);
      SCOPED_TRACE(str_cat("max_len ", max_len, " splits ", want));
      EXPECT_EQ(p.split_tokens % paged::kSplitChunk, 0);
      EXPECT_GE(int64_t(p.splits) * p.split_tokens, max_len);
      EXPECT_LT(int64_t(p.splits - 1) * p.split_tokens, std::max(max_len, 1));  // none empty
      EXPECT_LE(p.splits, paged::kMaxSplits);
      if (want > 0) {
        EXPECT_LE(p.splits, want);
      }
      EXPECT_EQ(p.partials, size_t(2) * 3 * 8 * p.splits);
      EXPECT_GE(p.workspace, p.partials * (128 * 4 + 8));
    }
  }
  PagedBatch b;
  b.batch = 1;
  b.max_len = 10;
  QueryRows q;
  q.max_n_q = 1;
  AttentionOptions o;
  o.n_heads = 6;
  EXPECT_THROW(paged::plan_splits(b, q, o, 4, 128, 132), InvalidArgument);  // 6 % 4
}

TEST(CudaPagedAttentionPlan, StagedRowsAreAlignedAndBankFriendly) {
  for (int d : {2, 3, 64, 80, 96, 128, 256}) {
    for (int bytes : {1, 2, 4, 6, 24, 27, 48, 50, 64, 112, 512, 1024}) {
      BlockGeometry g;
      g.k_offset = 0;
      g.v_offset = 16 * 1000;
      g.k_aux_offset = 16 * 2000;
      g.v_aux_offset = 16 * 3000;
      const int row_bytes[paged::kRegions] = {bytes, bytes + 1, 2, 4};
      const paged::StagePlan s = paged::plan_stages(g, row_bytes, d);
      SCOPED_TRACE(str_cat("head_dim ", d, " row bytes ", bytes));
      for (const paged::StageRegion& r : s.region) {
        EXPECT_EQ(r.smem_offset % 16, 0);
        if (r.unit > 0) {
          EXPECT_EQ(r.row_bytes % r.unit, 0);
          EXPECT_EQ((r.smem_stride / r.unit) % 2, 1) << "an odd number of copy units per row";
        } else {
          EXPECT_EQ(r.smem_stride, r.row_bytes);
        }
      }
      EXPECT_GE(s.smem_bytes, s.warps * s.stages * s.stage_bytes);
      EXPECT_GE(s.smem_bytes, s.warps * paged::kRows * (d + 2) * 4);
      EXPECT_LE(s.smem_bytes, paged::kMaxDynamicSmem);
    }
  }
}

// A block is kBlockTokens tokens of the CPU caches' records (their bytes_per_token_head).
TEST(CudaPagedAttentionPlan, UniformBlockBytesAreTheCpuRecords) {
  for (auto [d, kb, vb, group] :
       {std::tuple{96, 4, 3, 64}, std::tuple{128, 2, 8, 32}, std::tuple{80, 5, 5, 128}}) {
    const quant::UniformCodec key({d, kb, group}), value({d, vb, group});
    const UniformFormat f = make_uniform_format(3, key, value);
    const UniformKVCache cpu(3, d, UniformKVConfig{kb, vb, group});
    EXPECT_EQ(block_geometry(f).block_bytes, size_t(3) * kBlockTokens * cpu.bytes_per_token_head())
        << "head_dim " << d << " bits " << kb << "/" << vb << " group " << group;
  }
  EXPECT_EQ(block_geometry_tq35(8).block_bytes, size_t(8) * kBlockTokens * 116);
}

TEST_F(CudaPagedAttention, TurboQuantBlockBytesAreTheCpuRecords) {
  for (auto [d, kb, vb] :
       {std::tuple{128, 3.0, 4.0}, std::tuple{96, 2.5, 3.5}, std::tuple{64, 1.0, 8.0}}) {
    const PagedCodec codec(turboquant(kb, vb, d, 7, 4), 1);
    TurboQuantKVConfig config;
    config.key_bits = kb;
    config.value_bits = vb;
    const TurboQuantKVCache cpu(4, d, config);
    EXPECT_EQ(codec.geometry().block_bytes, size_t(4) * kBlockTokens * cpu.bytes_per_token_head())
        << "head_dim " << d << " bits " << kb << "/" << vb;
  }
}

}  // namespace
}  // namespace turbokv::cuda
