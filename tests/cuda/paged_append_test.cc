// paged_append against the CPU codecs: rows of random keys and values (with a zero vector, a
// huge one whose fp16 norm overflows and a tiny one in the f32 subnormal range) go through block
// tables whose blocks are not contiguous and handed out in shuffled order; the whole pool is then
// compared byte for byte with a host image where the CPU codec (scalar path) wrote the same
// records. Bytes of records never written (the rest of partly filled blocks, the zero block, the
// guard bands) must keep their fill pattern; padding rows and rows outside the table are skipped.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "kernels/cuda/device_buffer.h"
#include "paged_util.h"
#include "test_util.h"

namespace turbokv::cuda {
namespace {

using testing::BlockPool;
using testing::FormatKind;
using testing::FormatSpec;
using testing::PagedCodec;

constexpr uint8_t kFill = 0xA5;

struct Row {
  int seq, pos;
};

// Rows of a batch of 3 sequences owning {2, 1, 3} blocks (table stride 4): distinct random
// positions per sequence, a full run 0..9 and the last token of a block, shuffled; then rows
// that must be skipped (padding -1, a sequence past the batch, positions outside the table).
std::vector<Row> test_rows(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Row> rows;
  const int tokens[3] = {2 * kBlockTokens, kBlockTokens, 3 * kBlockTokens};
  for (int b = 0; b < 3; ++b) {
    std::vector<int> all(tokens[b]);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const int take = b == 1 ? 0 : 25;
    for (int i = 0; i < take; ++i) rows.push_back({b, all[i]});
  }
  for (int t = 0; t < 10; ++t) rows.push_back({1, t});
  rows.push_back({1, kBlockTokens - 1});
  std::shuffle(rows.begin(), rows.end(), rng);
  rows.push_back({-1, 3});
  rows.push_back({3, 5});
  rows.push_back({0, -1});
  rows.push_back({2, 4 * kBlockTokens});
  std::shuffle(rows.begin(), rows.end(), rng);
  return rows;
}

// [rows, kv_heads, d]: N(0, 1) times a per-vector scale e^U(-3, 3), with special vectors.
std::vector<float> test_vectors(size_t vectors, int d, uint64_t seed, FormatKind kind) {
  std::vector<float> x = testing::random_normal(vectors * d, seed);
  std::mt19937_64 rng(seed + 1);
  for (size_t v = 0; v < vectors; ++v) {
    const float s = std::exp(std::uniform_real_distribution<float>(-3, 3)(rng));
    for (int j = 0; j < d; ++j) x[v * d + j] *= s;
  }
  auto vec = [&](size_t v) { return &x[v * d]; };
  if (vectors > 8) {
    std::fill(vec(0), vec(0) + d, 0.0f);                              // zero vector
    for (int j = 0; j < d; ++j) vec(1)[j] = 1e5f * float(j % 7 - 3);  // fp16 norm overflow
    for (int j = 0; j < d; ++j) vec(2)[j] *= 1e-21f;               // squares in the f32 subnormals
    for (int j = 0; j < d; ++j) vec(3)[j] = j % 2 ? 0.0f : -0.0f;  // signed zeros
    for (int j = 0; j < d; ++j) vec(4)[j] = 1.5f;                  // a constant vector
  }
  if (kind == FormatKind::kDense && vectors > 8) {
    // Rounding cases of core/half.h: ties, fp16 overflow and subnormals, NaN, Inf.
    const float special[] = {1.0f + 1.0f / 256,
                             1.0f + 3.0f / 256,
                             1.0f + 1.0f / 2048,
                             1.0f + 3.0f / 2048,
                             65504.0f,
                             65519.0f,
                             65520.0f,
                             -70000.0f,
                             6.0e-8f,
                             2.9e-8f,
                             3.0e-8f,
                             1e-40f,
                             -1e-45f,
                             INFINITY,
                             -INFINITY,
                             NAN,
                             -NAN,
                             3.4e38f};
    for (int j = 0; j < d; ++j) vec(5)[j] = special[j % (sizeof(special) / sizeof(float))];
  }
  return x;
}

void check_append(const FormatSpec& spec) {
  SCOPED_TRACE(testing::describe(spec));
  const PagedCodec codec(spec, 3);
  const int kv = spec.kv_heads, d = spec.head_dim;
  BlockPool pool(codec.geometry().block_bytes, {2, 1, 3}, 4, spec.seed + 5, kFill);
  const std::vector<Row> rows = test_rows(spec.seed + 6);
  const int n = int(rows.size());
  const std::vector<float> k = test_vectors(size_t(n) * kv, d, spec.seed + 7, spec.kind);
  const std::vector<float> v = test_vectors(size_t(n) * kv, d, spec.seed + 8, spec.kind);

  std::vector<uint8_t> expected = pool.image();
  for (int r = 0; r < n; ++r) {
    const Row& row = rows[r];
    if (row.seq < 0 || row.seq >= pool.batch() || row.pos < 0 ||
        row.pos >= pool.table_stride() * kBlockTokens) {
      continue;
    }
    uint8_t* block = expected.data() + pool.block_offset(row.seq, row.pos / kBlockTokens);
    for (int h = 0; h < kv; ++h) {
      codec.encode(0, row.seq, h, &k[(size_t(r) * kv + h) * d], row.pos % kBlockTokens, block);
      codec.encode(1, row.seq, h, &v[(size_t(r) * kv + h) * d], row.pos % kBlockTokens, block);
    }
  }

  pool.upload();
  std::vector<int> seq(n), pos(n);
  for (int r = 0; r < n; ++r) seq[r] = rows[r].seq, pos[r] = rows[r].pos;
  auto d_k = DeviceBuffer<float>::upload(k);
  auto d_v = DeviceBuffer<float>::upload(v);
  auto d_seq = DeviceBuffer<int>::upload(seq);
  auto d_pos = DeviceBuffer<int>::upload(pos);
  auto d_len = DeviceBuffer<int>::upload({0, 0, 0});
  const AppendRows append{d_k.data(), d_v.data(), d_seq.data(), d_pos.data(), n};
  codec.append(pool.paged_batch(d_len.data(), 0), append, nullptr);
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<uint8_t> got = pool.download();
  ASSERT_EQ(got.size(), expected.size());
  int reported = 0;
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == expected[i]) continue;
    ++mismatches;
    if (reported++ < 5) {
      char bytes[64];
      std::snprintf(bytes, sizeof(bytes), "expected 0x%02x, got 0x%02x", expected[i], got[i]);
      ADD_FAILURE() << "pool byte " << i << " (" << pool.locate(i)
                    << (pool.in_blocks(i) ? ", " + codec.locate(pool.block_of(i)) : "")
                    << "): " << bytes;
    }
  }
  EXPECT_EQ(mismatches, 0u) << "bytes differing from the CPU codecs' records";
}

class CudaPagedAppend : public testing::CudaTest {};

TEST_F(CudaPagedAppend, TurboQuantIntegerBitsMatchCpuCodec) {
  uint64_t seed = 100;
  for (int d : {64, 80, 96, 128, 256}) {
    for (int bits = 1; bits <= 8; ++bits) {
      for (int mode : {0, 1, 2}) {  // plain, norm correction, unbiased
        FormatSpec s;
        s.kind = FormatKind::kTurboQuant;
        s.head_dim = d;
        s.key_bits = bits;
        s.value_bits = 9 - bits;
        s.norm_correction = mode != 0;
        s.unbiased_norm = mode == 2;
        s.seed = seed++;
        check_append(s);
      }
    }
  }
}

TEST_F(CudaPagedAppend, TurboQuantSplitCodecsWithPerHeadChannelOrders) {
  uint64_t seed = 300;
  for (int d : {64, 80, 96, 128, 256}) {
    for (int low = 1; low <= 7; ++low) {
      FormatSpec s;
      s.kind = FormatKind::kTurboQuant;
      s.kv_heads = 3;
      s.head_dim = d;
      s.key_bits = low + 0.5;
      s.value_bits = 8 - low + 0.5;
      s.norm_correction = low % 2 == 1;
      s.unbiased_norm = low % 3 == 0;
      s.norm_correction = s.norm_correction || s.unbiased_norm;
      s.seed = seed++;
      check_append(s);
    }
  }
}

TEST_F(CudaPagedAppend, TurboQuantCenteredVectors) {
  for (auto [key_bits, value_bits, d, nc] :
       {std::tuple{3.0, 4.0, 128, true}, std::tuple{2.5, 3.5, 96, true},
        std::tuple{4.0, 2.0, 64, false}, std::tuple{1.5, 8.0, 256, true}}) {
    FormatSpec s;
    s.kind = FormatKind::kTurboQuant;
    s.head_dim = d;
    s.key_bits = key_bits;
    s.value_bits = value_bits;
    s.norm_correction = nc;
    s.center = true;
    s.seed = 400 + d;
    check_append(s);
  }
}

TEST_F(CudaPagedAppend, UniformMatchesCpuCodec) {
  uint64_t seed = 500;
  for (int d : {80, 128}) {
    for (int bits = 2; bits <= 8; ++bits) {
      for (int group : {32, 64, 128}) {
        FormatSpec s;
        s.kind = FormatKind::kUniform;
        s.head_dim = d;
        s.key_bits = bits;
        s.value_bits = 10 - bits;
        s.group_size = group;
        s.seed = seed++;
        check_append(s);
      }
    }
  }
  for (int d : {64, 96, 256}) {
    for (auto [bits, group] : {std::pair{4, 64}, std::pair{3, 128}}) {
      FormatSpec s;
      s.kind = FormatKind::kUniform;
      s.head_dim = d;
      s.key_bits = bits;
      s.value_bits = bits + 1;
      s.group_size = group;
      s.seed = seed++;
      check_append(s);
    }
  }
}

TEST_F(CudaPagedAppend, DenseElementsRoundLikeCoreHalf) {
  uint64_t seed = 600;
  for (DenseElem e : {DenseElem::kF32, DenseElem::kF16, DenseElem::kBF16}) {
    for (int d : {3, 64, 80, 128, 256}) {
      FormatSpec s;
      s.kind = FormatKind::kDense;
      s.elem = e;
      s.head_dim = d;
      s.seed = seed++;
      check_append(s);
    }
  }
}

TEST(CudaPagedAppendArgs, RejectsBadFormatsAndBatches) {
  TQFormat f;
  f.kv_heads = 2;
  f.head_dim = 128;
  EXPECT_THROW(block_geometry(f), InvalidArgument);  // no segment data
  UniformFormat u{2, 128, {9, 64, 144, 2}, {4, 64, 64, 2}, 0, {}, {}};
  EXPECT_THROW(block_geometry(u), InvalidArgument);  // 9 bits
  u.key = {4, 48, 64, 3};
  EXPECT_THROW(block_geometry(u), InvalidArgument);  // group 48
  DenseFormat dense{DenseElem::kF16, 2, 300};
  EXPECT_THROW(block_geometry(dense), InvalidArgument);  // head_dim > 256
  dense.head_dim = 128;
  PagedBatch b;  // no table
  AppendRows rows;
  rows.rows = 1;
  EXPECT_THROW(paged_append(dense, b, rows, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::cuda
