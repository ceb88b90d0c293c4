// The CUDA attention kernels against the double-precision CPU reference:
//  - TurboQuant: keys/values quantized by the CUDA kernel (bit-identical to the CPU codec, see
//    quantize_test.cc) and attended on codes; the reference attends over the CPU codec's
//    dequantized vectors, so the only differences are the kernel's fp16 operands.
//  - dense fp16: the reference sees the same fp16-rounded keys and values.
// Batches mix sequence lengths (partial tiles, one-token sequences, many splits), GQA groups
// of 1, 4 and 8, decode (n_q = 1) and prefill over the cache (n_q > 1, causal).
#include "kernels/cuda/attention.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/tq_layout.h"
#include "kernels/cuda/tq_quantize.h"
#include "test_util.h"

namespace turbokv::cuda {
namespace {

using testing::CudaTest;
constexpr int kD = 128;

struct Case {
  std::vector<int> lens;
  int n_q;
  int n_heads;
  int kv_heads;
  int split_tokens = 0;  // AttentionProblem::split_tokens
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "lens";
  for (int len : c.lens) s << " " << len;
  s << ", n_q " << c.n_q << ", heads " << c.n_heads << "/" << c.kv_heads;
  if (c.split_tokens > 0) s << ", splits of " << c.split_tokens;
  return s.str();
}

int max_len(const Case& c) {
  return *std::max_element(c.lens.begin(), c.lens.end());
}

// Queries of the programmatic-launch calls: call i uses q * kPdlQueryScale[i], so that a call
// that read another call's partials would give a wrong result.
constexpr float kPdlQueryScale[3] = {1.0f, 1.5f, 0.5f};

// Runs `attend(problem, workspace, bytes, stream)` twice on one workspace, the output poisoned
// with NaN before each; returns the second output. The workspace must be all zero after each
// call (what the next call, of any shape, relies on). programmatic: instead, three calls with
// programmatic dependent launch queued back to back on one stream and one workspace (each may
// start while the one before finishes), with queries scaled by kPdlQueryScale and outputs of
// their own; returns the three outputs one after another.
template <typename Attend>
std::vector<float> run_attention(const Case& c, const std::vector<float>& q, float scale,
                                 CacheKind kind, Attend attend, bool programmatic = false) {
  const int calls = programmatic ? 3 : 1;
  std::vector<float> queries;
  for (int i = 0; i < calls; ++i) {
    for (float x : q) queries.push_back(programmatic ? x * kPdlQueryScale[i] : x);
  }
  auto d_q = DeviceBuffer<float>::upload(queries);
  auto d_lens = DeviceBuffer<int>::upload(c.lens);
  DeviceBuffer<float> d_out(queries.size());
  TURBOKV_CUDA_CHECK(cudaMemset(d_out.data(), 0xff, d_out.bytes()));  // NaN
  AttentionProblem p;
  p.seq_lens = d_lens.data();
  p.batch = int(c.lens.size());
  p.n_q = c.n_q;
  p.n_heads = c.n_heads;
  p.kv_heads = c.kv_heads;
  p.max_len = max_len(c);
  p.scale = scale;
  p.split_tokens = c.split_tokens;
  p.programmatic_launch = programmatic;
  auto call = [&](int i, cudaStream_t stream, void* ws, size_t bytes) {
    AttentionProblem pi = p;
    pi.q = d_q.data() + i * q.size();
    pi.out = d_out.data() + i * q.size();
    attend(pi, ws, bytes, stream);
  };
  const size_t bytes = attention_workspace_bytes(p, kind);
  DeviceBuffer<uint8_t> workspace(bytes);
  workspace.zero();
  auto expect_zero_workspace = [&] {
    const std::vector<uint8_t> w = workspace.download();
    EXPECT_EQ(size_t(std::count(w.begin(), w.end(), uint8_t(0))), w.size())
        << "workspace not all zero after a call";
  };
  if (programmatic) {
    cudaStream_t stream;
    TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int i = 0; i < calls; ++i) call(i, stream, workspace.data(), bytes);
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
    expect_zero_workspace();
    return d_out.download();
  }
  // Twice with one workspace: the first call must leave it ready for the next.
  call(0, nullptr, workspace.data(), bytes);
  expect_zero_workspace();
  TURBOKV_CUDA_CHECK(cudaMemset(d_out.data(), 0xff, d_out.bytes()));
  call(0, nullptr, workspace.data(), bytes);
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  expect_zero_workspace();
  return d_out.download();
}

// Max row relative error of run_attention's output(s) against reference(q) (of each call's
// queries when programmatic).
template <typename Reference>
double max_error(const std::vector<float>& out, const std::vector<float>& q, bool programmatic,
                 Reference reference) {
  double err = 0;
  const int calls = programmatic ? 3 : 1;
  for (int i = 0; i < calls; ++i) {
    std::vector<float> qi = q;
    for (float& x : qi) x *= programmatic ? kPdlQueryScale[i] : 1.0f;
    const std::vector<float> part(out.begin() + i * q.size(), out.begin() + (i + 1) * q.size());
    err = std::max(err, testing::max_row_relative_error(part, reference(qi), kD));
  }
  return err;
}

class CudaAttention : public CudaTest {};

int blocks_for(int tokens) { return (tokens + 255) / 256; }

// value_scale: multiplies the values (large ones make the kernel scale its fp16 operands).
// key_bits / value_bits: the codec pair (a fused tile format of tq_layout.h).
// Returns the output.
std::vector<float> check_turboquant(const Case& c, uint64_t seed, bool programmatic = false,
                                    float value_scale = 2.0f, int key_bits = 3,
                                    int value_bits = 4) {
  SCOPED_TRACE(describe(c) + " K" + std::to_string(key_bits) + "/V" + std::to_string(value_bits));
  const TQDeviceCodec codec(seed, /*norm_correction=*/true, key_bits, value_bits);
  const size_t kTqRun = size_t(kTilesPerBlock) * TQTileLayout{key_bits, value_bits}.tile_bytes();
  const int batch = int(c.lens.size()), cap = max_len(c);
  // k, v [batch, cap, kv_heads, 128]; keys with a common offset make the softmax peaky.
  std::vector<float> k = testing::random_normal(size_t(batch) * cap * c.kv_heads * kD, seed);
  const std::vector<float> v =
      testing::random_normal(size_t(batch) * cap * c.kv_heads * kD, seed + 1, value_scale);
  const std::vector<float> bias = testing::random_normal(kD, seed + 2, 0.5f);
  for (size_t i = 0; i < k.size(); ++i) k[i] += bias[i % kD];
  const std::vector<float> q =
      testing::random_normal(size_t(batch) * c.n_q * c.n_heads * kD, seed + 3, 1.5f);

  // Every sequence gets cap rows (positions 0 .. cap - 1), in blocks handed out shuffled.
  std::vector<int> row_seq, row_pos;
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < cap; ++t) row_seq.push_back(b), row_pos.push_back(t);
  }
  auto d_k = DeviceBuffer<float>::upload(k);
  auto d_v = DeviceBuffer<float>::upload(v);
  auto d_seq = DeviceBuffer<int>::upload(row_seq);
  auto d_pos = DeviceBuffer<int>::upload(row_pos);
  testing::PagedBlocks blocks(batch, blocks_for(cap), size_t(c.kv_heads) * kTqRun, seed + 4);
  DeviceBuffer<unsigned> vmax(1);
  vmax.zero();
  TQQuantizeProblem qp;
  qp.k = d_k.data();
  qp.v = d_v.data();
  qp.row_seq = d_seq.data();
  qp.row_pos = d_pos.data();
  qp.rows = int(row_seq.size());
  qp.kv_heads = c.kv_heads;
  qp.block_table = blocks.table();
  qp.table_stride = blocks.stride();
  qp.value_norm_max = vmax.data();
  tq_quantize(codec.kernel_codec(), qp, nullptr);

  // Reference inputs: the CPU codec's reconstruction of every key and value.
  std::vector<float> k_hat(k.size()), v_hat(v.size());
  for (size_t row = 0; row < k.size() / kD; ++row) {
    uint8_t codes[64];
    uint16_t norm;
    codec.key_codec().quantize(&k[row * kD], codes, &norm, quant::Isa::kScalar);
    codec.key_codec().dequantize(codes, &norm, &k_hat[row * kD]);
    codec.value_codec().quantize(&v[row * kD], codes, &norm, quant::Isa::kScalar);
    codec.value_codec().dequantize(codes, &norm, &v_hat[row * kD]);
  }
  const float scale = 1.0f / std::sqrt(float(kD));
  auto at = [&](const std::vector<float>& x) {
    return [&x, &c, cap](int b, int t, int h) {
      return &x[((size_t(b) * cap + t) * c.kv_heads + h) * kD];
    };
  };
  TQCacheView cache;
  cache.block_table = blocks.table();
  cache.table_stride = blocks.stride();
  cache.value_norm_max = vmax.data();
  const std::vector<float> out =
      run_attention(
          c, q, scale, CacheKind::kTurboQuant,
          [&](auto& p, void* ws, size_t bytes, cudaStream_t stream) {
            tq_attention(codec.kernel_codec(), cache, p, ws, bytes, stream);
          },
          programmatic);
  const double err = max_error(out, q, programmatic, [&](const std::vector<float>& qi) {
    return testing::reference_attention(qi, c.lens, c.n_q, c.n_heads, c.kv_heads, kD, scale,
                                        at(k_hat), at(v_hat));
  });
  std::printf("  turboquant max row relative error %.2e\n", err);
  EXPECT_LT(err, 4e-3);  // fp16 query, centroids and probabilities
  return out;
}

// Returns the output.
std::vector<float> check_dense(const Case& c, uint64_t seed, bool programmatic = false) {
  SCOPED_TRACE(describe(c));
  const int batch = int(c.lens.size()), cap = max_len(c);
  const int n_blocks = blocks_for(cap + 5);  // capacity past the longest sequence
  const size_t half_block = size_t(c.kv_heads) * 256 * kD;  // K or V elements of a block
  // Host values k, v [batch, kv_heads, tokens, 128], rounded to fp16 as the cache stores them.
  const size_t tokens = size_t(n_blocks) * 256;
  const std::vector<float> k = testing::round_to_f16(
      testing::random_normal(size_t(batch) * c.kv_heads * tokens * kD, seed));
  const std::vector<float> v = testing::round_to_f16(
      testing::random_normal(size_t(batch) * c.kv_heads * tokens * kD, seed + 1, 2.0f));
  const std::vector<float> q =
      testing::random_normal(size_t(batch) * c.n_q * c.n_heads * kD, seed + 3, 1.5f);
  testing::PagedBlocks blocks(batch, n_blocks, 2 * half_block * 2, seed + 4);
  for (int b = 0; b < batch; ++b) {
    // Blocks [n_blocks][K: kv_heads][256][128] | [V: ...] fp16; positions past each length hold
    // NaN: the kernel must never let them in.
    std::vector<uint16_t> host(size_t(n_blocks) * 2 * half_block);
    for (int h = 0; h < c.kv_heads; ++h) {
      for (size_t t = 0; t < tokens; ++t) {
        for (int j = 0; j < kD; ++j) {
          const size_t src = ((size_t(b) * c.kv_heads + h) * tokens + t) * kD + j;
          const size_t dst =
              (t / 256) * 2 * half_block + (size_t(h) * 256 + t % 256) * kD + j;
          const bool past = int(t) >= c.lens[b];
          host[dst] = past ? 0x7e00 : f32_to_f16(k[src]);
          host[dst + half_block] = past ? 0x7e00 : f32_to_f16(v[src]);
        }
      }
    }
    std::vector<uint8_t> bytes(host.size() * 2);
    std::memcpy(bytes.data(), host.data(), bytes.size());
    blocks.upload_sequence(b, bytes);
  }
  const float scale = 1.0f / std::sqrt(float(kD));
  auto at = [&](const std::vector<float>& x) {
    return [&x, &c, tokens](int b, int t, int h) {
      return &x[((size_t(b) * c.kv_heads + h) * tokens + t) * kD];
    };
  };
  DenseCacheView cache;
  cache.block_table = blocks.table();
  cache.table_stride = blocks.stride();
  const std::vector<float> out = run_attention(
      c, q, scale, CacheKind::kDense,
      [&](auto& p, void* ws, size_t bytes, cudaStream_t stream) {
        dense_attention(cache, p, ws, bytes, stream);
      },
      programmatic);
  const double err = max_error(out, q, programmatic, [&](const std::vector<float>& qi) {
    return testing::reference_attention(qi, c.lens, c.n_q, c.n_heads, c.kv_heads, kD, scale,
                                        at(k), at(v));
  });
  std::printf("  dense max row relative error %.2e\n", err);
  EXPECT_LT(err, 3e-3);  // fp16 query and P
  return out;
}

TEST_F(CudaAttention, TurboQuantDecodeMatchesReference) {
  check_turboquant({{1, 77, 1000, 32}, 1, 32, 8}, 100);
  check_turboquant({{300, 4}, 1, 8, 8}, 101);
  check_turboquant({{129}, 1, 8, 1}, 102);
}

// Every fused (key bits, value bits) pair: decode with partial tiles and GQA, many splits,
// causal prefill, and large value norms.
TEST_F(CudaAttention, TurboQuantEveryFusedBitPairMatchesReference) {
  const int pairs[][2] = {{3, 4}, {4, 3}, {4, 4}, {3, 3}, {2, 3}, {3, 2}};
  for (const auto& [kb, vb] : pairs) {
    ASSERT_TRUE(tq_attention_supported(kb, vb));
    check_turboquant({{1, 77, 1000, 32}, 1, 32, 8}, 150, false, 2.0f, kb, vb);
    check_turboquant({{9000}, 1, 32, 8}, 151, false, 2.0f, kb, vb);
    check_turboquant({{40, 100}, 7, 8, 2}, 152, false, 3000.0f, kb, vb);
  }
  EXPECT_FALSE(tq_attention_supported(2, 2));
  EXPECT_FALSE(tq_attention_supported(5, 4));
}

// A programmatic launch of a pair without a PDL instantiation runs as a plain launch.
TEST_F(CudaAttention, ProgrammaticLaunchOfOtherBitPairsMatchesReference) {
  check_turboquant({{1, 77, 1000, 32}, 1, 32, 8}, 160, true, 2.0f, 4, 4);
  check_turboquant({{20000, 9000}, 1, 32, 8}, 161, true, 2.0f, 4, 3);
}

TEST_F(CudaAttention, TurboQuantLongContextUsesManySplits) {
  check_turboquant({{20000, 9000}, 1, 32, 8}, 110);
}

// Value norms far above what fp16 operands hold at p <= 16: the kernel scales them by a power
// of two from the tracked maximum norm and the merge scales the output back.
TEST_F(CudaAttention, TurboQuantLargeValueNormsStayExact) {
  check_turboquant({{1000, 37}, 1, 32, 8}, 140, false, 3000.0f);
  check_turboquant({{40, 100}, 7, 8, 2}, 141, false, 3000.0f);
}

TEST_F(CudaAttention, TurboQuantPrefillOverQuantizedCacheIsCausal) {
  check_turboquant({{40, 100}, 7, 8, 2}, 120);
  check_turboquant({{64}, 64, 4, 2}, 121);
}

// Calls with programmatic dependent launch overlap the one before them on the stream; they
// must still wait for it before reading anything it writes (the shared workspace). Each call
// has other queries and its own output (run_attention).
TEST_F(CudaAttention, ProgrammaticLaunchBackToBackMatchesReference) {
  check_turboquant({{20000, 9000}, 1, 32, 8}, 130, true);
  check_turboquant({{1, 77, 1000, 32}, 1, 32, 8}, 131, true);
  check_turboquant({{40, 100}, 7, 8, 2}, 132, true);
  check_dense({{20000, 300}, 1, 32, 8}, 230, true);
}

TEST_F(CudaAttention, DenseDecodeMatchesReference) {
  check_dense({{1, 77, 1000, 32}, 1, 32, 8}, 200);
  check_dense({{300, 4}, 1, 8, 8}, 201);
  check_dense({{20000}, 1, 32, 8}, 202);
}

TEST_F(CudaAttention, DensePrefillIsCausal) {
  check_dense({{40, 100}, 7, 8, 2}, 210);
}

// Fixed split lengths (batch-invariant decoding): sequence 0's output is the same bits alone
// and among 39 others of other lengths, where the call runs in several waves of sequences. The
// inputs of sequence 0 are the same in both runs (it is the longest, so the layouts agree).
TEST_F(CudaAttention, FixedSplitsGiveEachSequenceTheSameBitsInAnyBatch) {
  Case batch{{2100}, 1, 32, 8, 1024};
  for (int i = 1; i < 40; ++i) batch.lens.push_back(1 + (i * 397) % 2000);
  const Case alone{{2100}, 1, 32, 8, 1024};
  const size_t row = size_t(32) * kD;  // sequence 0's output
  for (const auto& [kb, vb] : {std::pair{3, 4}, std::pair{4, 3}}) {
    const std::vector<float> a = check_turboquant(alone, 170, false, 2.0f, kb, vb);
    const std::vector<float> b = check_turboquant(batch, 170, false, 2.0f, kb, vb);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), row * sizeof(float)), 0) << "K" << kb << "/V" << vb;
    const std::vector<float> pa = check_turboquant(alone, 171, true, 2.0f, kb, vb);
    const std::vector<float> pb = check_turboquant(batch, 171, true, 2.0f, kb, vb);
    EXPECT_EQ(std::memcmp(pa.data(), pb.data(), row * sizeof(float)), 0) << "PDL";
  }
  const std::vector<float> a = check_dense(alone, 270);
  const std::vector<float> b = check_dense(batch, 270);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), row * sizeof(float)), 0) << "dense";
}

TEST(CudaAttentionArgs, RejectsBadShapesBeforeTouchingTheDevice) {
  AttentionProblem p;
  p.batch = 1;
  p.n_q = 1;
  p.n_heads = 6;
  p.kv_heads = 4;
  p.max_len = 10;
  p.scale = 0.1f;
  EXPECT_THROW(attention_workspace_bytes(p, CacheKind::kTurboQuant), InvalidArgument);
  p.n_heads = 8;
  p.max_len = 0;
  EXPECT_THROW(attention_workspace_bytes(p, CacheKind::kDense), InvalidArgument);
  p.max_len = 10;
  p.scale = 0;
  EXPECT_THROW(attention_workspace_bytes(p, CacheKind::kDense), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::cuda
