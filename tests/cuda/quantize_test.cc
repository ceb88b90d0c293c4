// The quantize kernel against the CPU codec (quant::MseCodec, scalar path): codes and fp16
// norms must be identical, token for token, also when tokens arrive one at a time.
#include <cuda_runtime.h>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/tq_layout.h"
#include "kernels/cuda/tq_quantize.h"
#include "test_util.h"

namespace turbokv::cuda {
namespace {

using testing::CudaTest;
constexpr int kD = 128;

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

// Expects device tiles [batch, kv_heads, max_tiles] to hold the CPU codes of k/v
// [batch, n, kv_heads, 128] at positions start[b] .. start[b] + n - 1.
void expect_codes_match(const TQDeviceCodec& codec, const std::vector<uint8_t>& tiles,
                        const std::vector<float>& k, const std::vector<float>& v,
                        const std::vector<int>& start, int n, int kv_heads, int max_tiles) {
  const int batch = int(start.size());
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < kv_heads; ++h) {
      const uint8_t* seq =
          tiles.data() + (size_t(b) * kv_heads + h) * max_tiles * TQ35Layout::kTileBytes;
      const TQHostCodes got = tq_codes_from_tiles(seq, start[b] + n);
      for (int i = 0; i < n; ++i) {
        const int t = start[b] + i;
        const float* kx = &k[((size_t(b) * n + i) * kv_heads + h) * kD];
        const float* vx = &v[((size_t(b) * n + i) * kv_heads + h) * kD];
        uint8_t kc[48], vc[64];
        uint16_t kn, vn;
        codec.key_codec().quantize(kx, kc, &kn, quant::Isa::kScalar);
        codec.value_codec().quantize(vx, vc, &vn, quant::Isa::kScalar);
        ASSERT_EQ(std::vector<uint8_t>(kc, kc + 48),
                  std::vector<uint8_t>(&got.key_codes[t * 48], &got.key_codes[t * 48] + 48))
            << "key codes, seq " << b << " head " << h << " token " << t;
        ASSERT_EQ(std::vector<uint8_t>(vc, vc + 64),
                  std::vector<uint8_t>(&got.value_codes[t * 64], &got.value_codes[t * 64] + 64))
            << "value codes, seq " << b << " head " << h << " token " << t;
        ASSERT_EQ(kn, got.key_norms[t]) << "key norm, seq " << b << " token " << t;
        ASSERT_EQ(vn, got.value_norms[t]) << "value norm, seq " << b << " token " << t;
      }
    }
  }
}

TEST_F(CudaQuantize, PrefillCodesAreBitIdenticalToCpu) {
  for (bool norm_correction : {true, false}) {
    const TQDeviceCodec codec(/*seed=*/3, norm_correction);
    const int batch = 2, n = 70, kv_heads = 3, max_tiles = 4;
    const std::vector<int> start = {0, 45};
    const std::vector<float> k = test_vectors(size_t(batch) * n * kv_heads, 11);
    const std::vector<float> v = test_vectors(size_t(batch) * n * kv_heads, 12);
    auto d_k = DeviceBuffer<float>::upload(k);
    auto d_v = DeviceBuffer<float>::upload(v);
    auto d_start = DeviceBuffer<int>::upload(start);
    DeviceBuffer<uint8_t> tiles(size_t(batch) * kv_heads * max_tiles * TQ35Layout::kTileBytes);
    tiles.zero();
    TQQuantizeProblem p{d_k.data(), d_v.data(), d_start.data(), tiles.data(),
                        batch,      n,          kv_heads,       max_tiles};
    tq_quantize(codec.kernel_codec(), p, nullptr);
    TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    // Tokens before start[1] of sequence 1 were never written: their codes stay zero.
    const std::vector<uint8_t> host = tiles.download();
    expect_codes_match(codec, host, k, v, {0, 45}, n, kv_heads, max_tiles);
    const TQHostCodes untouched = tq_codes_from_tiles(
        host.data() + size_t(kv_heads) * max_tiles * TQ35Layout::kTileBytes, 45);
    for (uint8_t byte : untouched.value_codes) ASSERT_EQ(byte, 0);
  }
}

// Decode: one token per step overwrites nibbles that share words with neighbours.
TEST_F(CudaQuantize, DecodeStepsKeepNeighbourCodes) {
  const TQDeviceCodec codec(/*seed=*/0);
  const int batch = 3, kv_heads = 2, steps = 40, max_tiles = 2;
  const std::vector<float> k = test_vectors(size_t(batch) * steps * kv_heads, 21);
  const std::vector<float> v = test_vectors(size_t(batch) * steps * kv_heads, 22);
  DeviceBuffer<uint8_t> tiles(size_t(batch) * kv_heads * max_tiles * TQ35Layout::kTileBytes);
  tiles.zero();
  std::vector<float> all_k(k.size()), all_v(v.size());  // [batch, steps, kv_heads, 128]
  for (int s = 0; s < steps; ++s) {
    std::vector<float> step_k(size_t(batch) * kv_heads * kD), step_v(step_k.size());
    for (int b = 0; b < batch; ++b) {
      for (size_t j = 0; j < size_t(kv_heads) * kD; ++j) {
        const size_t src = (size_t(b) * steps + s) * kv_heads * kD + j;
        step_k[size_t(b) * kv_heads * kD + j] = k[src];
        step_v[size_t(b) * kv_heads * kD + j] = v[src];
      }
    }
    auto d_k = DeviceBuffer<float>::upload(step_k);
    auto d_v = DeviceBuffer<float>::upload(step_v);
    auto d_start = DeviceBuffer<int>::upload(std::vector<int>(batch, s));
    TQQuantizeProblem p{d_k.data(), d_v.data(), d_start.data(), tiles.data(),
                        batch,      1,          kv_heads,       max_tiles};
    tq_quantize(codec.kernel_codec(), p, nullptr);
  }
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  expect_codes_match(codec, tiles.download(), k, v, std::vector<int>(batch, 0), steps, kv_heads,
                     max_tiles);
}

TEST(CudaQuantizeArgs, RejectsEmptyShapes) {
  TQKernelCodec codec{};
  TQQuantizeProblem p;
  p.batch = 1;
  p.n_new = 0;
  p.kv_heads = 1;
  p.max_tiles = 1;
  EXPECT_THROW(tq_quantize(codec, p, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::cuda
