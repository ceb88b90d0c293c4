// The quantize kernel against the CPU codec (quant::MseCodec, scalar path): codes and fp16
// norms must be identical, token for token, in paged blocks handed out in shuffled order, also
// when tokens arrive one at a time.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/tq_layout.h"
#include "kernels/cuda/tq_quantize.h"
#include "test_util.h"

namespace turbokv::cuda {
namespace {

using testing::CudaTest;
using testing::PagedBlocks;
constexpr int kD = 128;

// One head's tiles of a block in the codec's format.
TQTileLayout layout_of(const TQDeviceCodec& codec) {
  return TQTileLayout{codec.kernel_codec().key_bits, codec.kernel_codec().value_bits};
}
size_t head_run(const TQDeviceCodec& codec) {
  return size_t(kTilesPerBlock) * layout_of(codec).tile_bytes();
}

class CudaQuantize : public CudaTest {};

// Random vectors with a spread of norms, a zero vector and a huge one (fp16 norm overflow).
std::vector<float> test_vectors(size_t vectors, uint64_t seed) {
  std::vector<float> x = testing::random_normal(vectors * kD, seed);
  std::mt19937_64 rng(seed + 1);
  for (size_t v = 0; v < vectors; ++v) {
    const float s = std::exp(std::uniform_real_distribution<float>(-4, 4)(rng));
    for (int j = 0; j < kD; ++j) x[v * kD + j] *= s;
  }
  std::fill(x.begin(), x.begin() + kD, 0.0f);
  if (vectors > 3) {
    for (int j = 0; j < kD; ++j) x[3 * kD + j] = 1e4f * float(j % 7 - 3);
  }
  return x;
}

// Rows of one append: row r of sequence seq[r] at position pos[r].
struct Rows {
  std::vector<float> k, v;  // [rows, kv_heads, 128]
  std::vector<int> seq, pos;
};

void quantize(const TQDeviceCodec& codec, const Rows& rows, int kv_heads, const PagedBlocks& blocks,
              unsigned* value_norm_max = nullptr) {
  auto d_k = DeviceBuffer<float>::upload(rows.k);
  auto d_v = DeviceBuffer<float>::upload(rows.v);
  auto d_seq = DeviceBuffer<int>::upload(rows.seq);
  auto d_pos = DeviceBuffer<int>::upload(rows.pos);
  TQQuantizeProblem p;
  p.k = d_k.data();
  p.v = d_v.data();
  p.row_seq = d_seq.data();
  p.row_pos = d_pos.data();
  p.rows = int(rows.seq.size());
  p.kv_heads = kv_heads;
  p.block_table = blocks.table();
  p.table_stride = blocks.stride();
  p.value_norm_max = value_norm_max;
  tq_quantize(codec.kernel_codec(), p, nullptr);
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
}

// Expects every row's codes and norms in the blocks to equal the CPU codec's.
void expect_codes_match(const TQDeviceCodec& codec, const PagedBlocks& blocks, const Rows& rows,
                        int batch, int kv_heads) {
  const TQTileLayout lay = layout_of(codec);
  const int kcb = lay.key_code_bytes(), vcb = lay.value_code_bytes();
  for (int b = 0; b < batch; ++b) {
    const std::vector<uint8_t> seq = blocks.download_sequence(b);
    for (int h = 0; h < kv_heads; ++h) {
      const std::vector<uint8_t> tiles =
          tq_head_tiles_from_blocks(seq.data(), blocks.stride(), kv_heads, h, lay.tile_bytes());
      const TQHostCodes got =
          tq_codes_from_tiles(tiles.data(), blocks.stride() * 256, lay.key_bits, lay.value_bits);
      for (size_t r = 0; r < rows.seq.size(); ++r) {
        if (rows.seq[r] != b) continue;
        const int t = rows.pos[r];
        const float* kx = &rows.k[(r * kv_heads + h) * kD];
        const float* vx = &rows.v[(r * kv_heads + h) * kD];
        uint8_t kc[64], vc[64];
        uint16_t kn, vn;
        codec.key_codec().quantize(kx, kc, &kn, quant::Isa::kScalar);
        codec.value_codec().quantize(vx, vc, &vn, quant::Isa::kScalar);
        ASSERT_EQ(std::vector<uint8_t>(kc, kc + kcb),
                  std::vector<uint8_t>(&got.key_codes[t * kcb], &got.key_codes[t * kcb] + kcb))
            << "key codes, seq " << b << " head " << h << " token " << t;
        ASSERT_EQ(std::vector<uint8_t>(vc, vc + vcb),
                  std::vector<uint8_t>(&got.value_codes[t * vcb], &got.value_codes[t * vcb] + vcb))
            << "value codes, seq " << b << " head " << h << " token " << t;
        ASSERT_EQ(kn, got.key_norms[t]) << "key norm, seq " << b << " token " << t;
        ASSERT_EQ(vn, got.value_norms[t]) << "value norm, seq " << b << " token " << t;
      }
    }
  }
}

// Every (key bits, value bits) pair of a fused tile format (tq_layout.h).
constexpr int kBitPairs[][2] = {{3, 4}, {4, 3}, {4, 4}, {3, 3}, {2, 3},
                                {3, 2}, {2, 2}, {2, 4}, {4, 2}};

TEST_F(CudaQuantize, PrefillCodesAreBitIdenticalToCpu) {
  for (const auto& [kb, vb] : kBitPairs) {
    for (int norm_mode : {0, 1, 2}) {  // plain, norm correction, unbiased
      const bool norm_correction = norm_mode != 0;
      SCOPED_TRACE(::testing::Message() << "K" << kb << "/V" << vb << " norm mode " << norm_mode);
      const TQDeviceCodec codec(/*seed=*/3, norm_correction, kb, vb, norm_mode == 2);
      const size_t kRun = head_run(codec);
      const int batch = 2, kv_heads = 3, stride = 2;
      // Sequence 0: positions 0..299 (across a block boundary), sequence 1: 245..314.
      Rows rows;
      for (int i = 0; i < 300; ++i) rows.seq.push_back(0), rows.pos.push_back(i);
      for (int i = 245; i < 315; ++i) rows.seq.push_back(1), rows.pos.push_back(i);
      rows.k = test_vectors(rows.seq.size() * kv_heads, 11);
      rows.v = test_vectors(rows.seq.size() * kv_heads, 12);
      PagedBlocks blocks(batch, stride, size_t(kv_heads) * kRun, 5);
      DeviceBuffer<unsigned> vmax(1);
      vmax.zero();
      quantize(codec, rows, kv_heads, blocks, vmax.data());
      expect_codes_match(codec, blocks, rows, batch, kv_heads);
      // Tokens before 245 of sequence 1 were never written: their codes stay zero.
      const std::vector<uint8_t> seq1 = blocks.download_sequence(1);
      for (int h = 0; h < kv_heads; ++h) {
        const std::vector<uint8_t> tiles = tq_head_tiles_from_blocks(
            seq1.data(), stride, kv_heads, h, layout_of(codec).tile_bytes());
        const TQHostCodes untouched = tq_codes_from_tiles(tiles.data(), 245, kb, vb);
        for (uint8_t byte : untouched.value_codes) ASSERT_EQ(byte, 0);
      }
      // The largest stored value norm is tracked (as float bits of the fp16 norm).
      float expected = 0;
      for (size_t r = 0; r < rows.seq.size() * kv_heads; ++r) {
        uint8_t vc[64];
        uint16_t vn;
        codec.value_codec().quantize(&rows.v[r * kD], vc, &vn, quant::Isa::kScalar);
        expected = std::max(expected, std::fabs(f16_to_f32(vn)));
      }
      const std::vector<unsigned> got = vmax.download();
      float got_max;
      std::memcpy(&got_max, got.data(), 4);
      EXPECT_EQ(got_max, expected);
    }
  }
}

// Decode: one token per step overwrites nibbles that share words with neighbours.
TEST_F(CudaQuantize, DecodeStepsKeepNeighbourCodes) {
  for (const auto& [kb, vb] : kBitPairs) {
    SCOPED_TRACE(::testing::Message() << "K" << kb << "/V" << vb);
    const TQDeviceCodec codec(/*seed=*/0, true, kb, vb);
    const size_t kRun = head_run(codec);
    const int batch = 3, kv_heads = 2, steps = 40, stride = 1;
    PagedBlocks blocks(batch, stride, size_t(kv_heads) * kRun, 9);
    Rows all;
    for (int s = 0; s < steps; ++s) {
      Rows step;
      for (int b = 0; b < batch; ++b) step.seq.push_back(b), step.pos.push_back(s);
      step.k = test_vectors(size_t(batch) * kv_heads, 100 + s);
      step.v = test_vectors(size_t(batch) * kv_heads, 200 + s);
      quantize(codec, step, kv_heads, blocks);
      all.seq.insert(all.seq.end(), step.seq.begin(), step.seq.end());
      all.pos.insert(all.pos.end(), step.pos.begin(), step.pos.end());
      all.k.insert(all.k.end(), step.k.begin(), step.k.end());
      all.v.insert(all.v.end(), step.v.begin(), step.v.end());
    }
    expect_codes_match(codec, blocks, all, batch, kv_heads);
  }
}

// RoPE + quantize in one kernel = qkv_post then tq_quantize: the same queries, the same cache
// bytes (full and partial rotary dims, a bias, attention scaling).
TEST_F(CudaQuantize, RopeQuantizeEqualsQkvPostThenQuantize) {
  for (const auto& [kb, vb] : {std::pair{3, 4}, std::pair{4, 3}}) {
    for (int rotary : {128, 64, 0}) {
      SCOPED_TRACE(::testing::Message() << "K" << kb << "/V" << vb << " rotary " << rotary);
      const TQDeviceCodec codec(/*seed=*/5, true, kb, vb);
      const int rows = 3, heads = 8, kv_heads = 2, width = (heads + 2 * kv_heads) * kD;
      const std::vector<float> qkv = test_vectors(size_t(rows) * (heads + 2 * kv_heads), 40);
      const std::vector<float> bias = testing::random_normal(size_t(width), 41, 0.1f);
      std::vector<float> inv_freq(size_t(std::max(rotary / 2, 1)));
      for (size_t i = 0; i < inv_freq.size(); ++i) {
        inv_freq[i] = std::pow(10000.0f, -2.0f * float(i) / float(std::max(rotary, 2)));
      }
      const std::vector<int> seq = {0, 1, 1}, pos = {7, 300, 301};
      auto d_qkv = DeviceBuffer<float>::upload(qkv);
      auto d_bias = DeviceBuffer<float>::upload(bias);
      auto d_inv = DeviceBuffer<float>::upload(inv_freq);
      auto d_seq = DeviceBuffer<int>::upload(seq);
      auto d_pos = DeviceBuffer<int>::upload(pos);
      DeviceBuffer<float> q1(size_t(rows) * heads * kD), q2(q1.size());
      DeviceBuffer<float> k(size_t(rows) * kv_heads * kD), v(k.size());
      PagedBlocks blocks1(2, 2, size_t(kv_heads) * head_run(codec), 3);
      PagedBlocks blocks2(2, 2, size_t(kv_heads) * head_run(codec), 3);
      QkvPostProblem qp;
      qp.qkv = d_qkv.data();
      qp.bias = d_bias.data();
      qp.positions = d_pos.data();
      qp.inv_freq = d_inv.data();
      qp.rotary_dim = rotary;
      qp.attention_scaling = 0.8f;
      qp.tokens = rows;
      qp.heads = heads;
      qp.kv_heads = kv_heads;
      qp.head_dim = kD;
      qp.q = q1.data();
      qp.k = k.data();
      qp.v = v.data();
      qkv_post(qp, nullptr);
      TQQuantizeProblem p;
      p.k = k.data();
      p.v = v.data();
      p.row_seq = d_seq.data();
      p.row_pos = d_pos.data();
      p.rows = rows;
      p.kv_heads = kv_heads;
      p.block_table = blocks1.table();
      p.table_stride = blocks1.stride();
      tq_quantize(codec.kernel_codec(), p, nullptr);
      TQRopeQuantizeProblem r;
      r.qkv = d_qkv.data();
      r.bias = d_bias.data();
      r.positions = d_pos.data();
      r.inv_freq = d_inv.data();
      r.rotary_dim = rotary;
      r.attention_scaling = 0.8f;
      r.heads = heads;
      r.q = q2.data();
      r.cache = p;
      r.cache.k = r.cache.v = nullptr;
      r.cache.block_table = blocks2.table();
      tq_rope_quantize(codec.kernel_codec(), r, nullptr);
      TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(q1.download(), q2.download());
      for (int b = 0; b < 2; ++b) {
        EXPECT_EQ(blocks1.download_sequence(b), blocks2.download_sequence(b)) << "sequence " << b;
      }
    }
  }
  EXPECT_FALSE(tq_rope_quantize_supported(60));
  EXPECT_TRUE(tq_rope_quantize_supported(64));
}

TEST(CudaQuantizeArgs, RejectsEmptyShapes) {
  TQKernelCodec codec{};
  TQQuantizeProblem p;
  p.rows = 0;
  p.kv_heads = 1;
  p.table_stride = 1;
  EXPECT_THROW(tq_quantize(codec, p, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::cuda
