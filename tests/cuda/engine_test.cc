// The CUDA engine against references we did not write and against the CPU engine:
//  - every fixture family's logits and greedy tokens against transformers (dense caches);
//  - device KV caches byte-identical to the CPU caches for the same keys and values (their
//    saved records compared byte for byte), every TurboQuant / uniform / dense setting, and
//    attention on them against the CPU caches' attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "kv/byte_io.h"
#include "kv/cache_policy.h"
#include "kv/cuda/device_caches.h"
#include "model/cuda/cuda_decoder.h"
#include "model/decoder.h"
#include "test_util.h"
#include "tests/model/golden.h"

namespace turbokv::cuda {
namespace {

using testing::CudaTest;

std::string fixture(const std::string& rel) {
  return std::string(TURBOKV_SOURCE_DIR) + "/tests/fixtures/" + rel;
}

std::unique_ptr<CudaDecoderModel> load_gpu(const std::string& dir) {
  std::unique_ptr<Model> model = Model::load(dir);
  auto* decoder = dynamic_cast<DecoderModel*>(model.release());
  CudaModelOptions options;
  options.kv_cache_bytes = size_t(512) << 20;
  return std::make_unique<CudaDecoderModel>(std::unique_ptr<DecoderModel>(decoder), options);
}

class CudaEngine : public CudaTest {};

class CudaGolden : public CudaEngine, public ::testing::WithParamInterface<const char*> {};

// fp32 weights run as fp32 GEMMs, dense caches in fp32: the CPU engine's tolerance.
TEST_P(CudaGolden, LogitsAndGreedyTokensMatchTransformers) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  auto gpu = load_gpu(dir);
  const float tolerance = std::string(GetParam()) == "gemma2" ? 2e-3f : 1e-3f;
  turbokv::testing::check_golden(
      *gpu, [&] { return gpu->make_caches(ResolvedKV{}, DenseElem::kF32); },
      dir + "/reference.safetensors", tolerance, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Families, CudaGolden,
                         ::testing::Values("llama", "qwen2", "qwen3", "mistral", "gemma2",
                                           "gemma3_text", "phi3", "qwen3_moe"));

// bf16 weights: the GEMM inputs are bf16 (the CPU widens them to fp32), so the logits move
// more; the greedy tokens must not.
TEST_F(CudaEngine, TinycodeMatchesTransformers) {
  auto gpu = load_gpu(std::string(TURBOKV_SOURCE_DIR) + "/models/tinycode-llama");
  for (DenseElem elem : {DenseElem::kF32, DenseElem::kF16}) {
    turbokv::testing::check_golden(
        *gpu, [&] { return gpu->make_caches(ResolvedKV{}, elem); },
        fixture("tinycode-llama-reference.safetensors"), 0.25f,
        elem == DenseElem::kF32 ? "tinycode, f32 caches" : "tinycode, f16 caches");
  }
}

// ---------------------------------------------------------------------------- KV parity

struct KVCase {
  LayerCachePlan plan;
  DenseElem elem = DenseElem::kF16;
  std::string name;
};

std::vector<KVCase> kv_cases() {
  std::vector<KVCase> cases;
  auto tq = [&](int d, double kb, double vb, bool nc) {
    KVCase c;
    c.plan.kind = LayerCacheKind::kTurboQuant;
    c.plan.kv_heads = 2;
    c.plan.head_dim = d;
    c.plan.turboquant = TurboQuantKVConfig{kb, vb, 7, nc};
    std::ostringstream s;
    s << "turboquant d" << d << " K" << kb << "/V" << vb << (nc ? "" : " no-nc");
    c.name = s.str();
    cases.push_back(c);
  };
  for (int d : {64, 80, 96, 128, 256}) {
    for (auto [kb, vb] : std::vector<std::pair<double, double>>{
             {1, 1}, {2, 2}, {2, 3}, {3, 3}, {3, 4}, {4, 4}, {4, 2}, {5, 6}, {8, 8},
             {7, 7}, {2.5, 2.5}, {1.5, 2.5}, {3, 3.5}, {3.5, 3.5}, {3.5, 4}, {4, 3}, {3, 2}}) {
      tq(d, kb, vb, true);
    }
  }
  tq(128, 3, 4, false);
  tq(80, 3.5, 3.5, false);
  for (int d : {64, 128, 256}) {
    for (int bits = 2; bits <= 8; ++bits) {
      for (int g : {32, 64, 128}) {
        KVCase c;
        c.plan.kind = LayerCacheKind::kUniform;
        c.plan.kv_heads = 2;
        c.plan.head_dim = d;
        c.plan.uniform = UniformKVConfig{bits, bits, g};
        c.name = "uniform d" + std::to_string(d) + " b" + std::to_string(bits) + " g" +
                 std::to_string(g);
        cases.push_back(c);
      }
    }
  }
  {
    KVCase c;
    c.plan.kind = LayerCacheKind::kUniform;
    c.plan.kv_heads = 2;
    c.plan.head_dim = 128;
    c.plan.uniform = UniformKVConfig{4, 2, 64};
    c.name = "uniform d128 K4/V2 g64";
    cases.push_back(c);
  }
  for (int d : {64, 80, 128, 256}) {
    for (DenseElem e : {DenseElem::kF32, DenseElem::kF16, DenseElem::kBF16}) {
      KVCase c;
      c.plan.kind = LayerCacheKind::kDense;
      c.plan.kv_heads = 2;
      c.plan.head_dim = d;
      c.elem = e;
      c.name = "dense d" + std::to_string(d) + " elem " + std::to_string(int(e));
      cases.push_back(c);
    }
  }
  return cases;
}

std::vector<uint8_t> saved(const KVCache& cache) {
  ByteWriter w;
  cache.save(w);
  return w.buffer();
}

class CudaKV : public CudaTest {};

// Appends the same keys and values (chunks across block boundaries, then decode steps) to a
// CPU cache and a device cache of one plan: the saved records are identical, and attention
// on them agrees.
TEST_F(CudaKV, DeviceCachesHoldTheCpuCachesBytesAndAttendAlike) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceCacheContext context(size_t(256) << 20, stream);
    int failures = 0;
    for (const KVCase& c : kv_cases()) {
      SCOPED_TRACE(c.name);
      const KVDType cpu_dtype = c.elem == DenseElem::kF32   ? KVDType::kF32
                                : c.elem == DenseElem::kBF16 ? KVDType::kBF16
                                                             : KVDType::kF16;
      LayerCaches cpu;
      try {
        cpu = make_layer_caches({c.plan}, cpu_dtype);
      } catch (const InvalidArgument&) {
        continue;  // a setting the CPU cache refuses is not one to compare
      }
      LayerCaches gpu = make_device_layer_caches(context, {c.plan}, c.elem, /*fused=*/true);
      const int heads = c.plan.kv_heads, d = c.plan.head_dim;
      uint64_t seed = 1;
      for (int n : {70, 1, 1, 300, 1}) {
        const std::vector<float> k = testing::random_normal(size_t(n) * heads * d, seed++, 1.5f);
        const std::vector<float> v = testing::random_normal(size_t(n) * heads * d, seed++, 3.0f);
        cpu[0]->append(k.data(), v.data(), n);
        gpu[0]->append(k.data(), v.data(), n);
      }
      ASSERT_EQ(gpu[0]->size(), cpu[0]->size());
      EXPECT_EQ(gpu[0]->nbytes(), cpu[0]->nbytes());
      const std::vector<uint8_t> want = saved(*cpu[0]), got = saved(*gpu[0]);
      if (want != got) {
        size_t i = 0;
        while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
        ADD_FAILURE() << c.name << ": saved records differ at byte " << i << " of "
                      << want.size() << " (device record " << got.size() << " bytes)";
        if (++failures > 10) break;
      }
      for (int n_q : {1, 5}) {
        AttentionParams params;
        params.n_heads = heads * 4;
        params.scale = 1.0f / std::sqrt(float(d));
        const std::vector<float> q =
            testing::random_normal(size_t(n_q) * params.n_heads * d, seed++, 1.0f);
        std::vector<float> want_out(q.size()), got_out(q.size());
        cpu[0]->attend(q.data(), n_q, params, want_out.data());
        gpu[0]->attend(q.data(), n_q, params, got_out.data());
        const double err = testing::max_row_relative_error(got_out, want_out, d);
        EXPECT_LT(err, 5e-3) << c.name << " n_q " << n_q;
      }
    }
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// A cache saved from the GPU loads into a CPU cache (and back) and continues identically.
TEST_F(CudaKV, SavedCachesMoveBetweenDevices) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceCacheContext context(size_t(64) << 20, stream);
    LayerCachePlan plan;
    plan.kind = LayerCacheKind::kTurboQuant;
    plan.kv_heads = 2;
    plan.head_dim = 128;
    plan.turboquant = TurboQuantKVConfig{3.5, 3.5, 0, true};
    LayerCaches gpu = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
    const std::vector<float> k = testing::random_normal(size_t(40) * 2 * 128, 3);
    gpu[0]->append(k.data(), k.data(), 40);
    ByteWriter w;
    gpu[0]->save(w);
    LayerCaches cpu = make_layer_caches({plan}, KVDType::kF16);
    ByteReader r(w.buffer().data(), w.buffer().size());
    cpu[0]->load(r);
    LayerCaches gpu2 = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
    ByteReader r2(w.buffer().data(), w.buffer().size());
    gpu2[0]->load(r2);
    const std::vector<float> more = testing::random_normal(size_t(3) * 2 * 128, 4);
    cpu[0]->append(more.data(), more.data(), 3);
    gpu2[0]->append(more.data(), more.data(), 3);
    EXPECT_EQ(saved(*cpu[0]), saved(*gpu2[0]));
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Prefix sharing: whole blocks copied out of one cache are the same physical blocks in the
// other; writes after a trim into a shared block go to a private copy.
TEST_F(CudaKV, WholeBlocksAreSharedAndCopiedOnWrite) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceCacheContext context(size_t(64) << 20, stream);
    for (double bits : {3.5, 4.0, 0.0}) {
      LayerCachePlan plan;
      plan.kv_heads = 2;
      plan.head_dim = 128;
      plan.kind = bits == 0 ? LayerCacheKind::kDense : LayerCacheKind::kTurboQuant;
      plan.turboquant = TurboQuantKVConfig{bits == 0 ? 3 : bits, bits == 0 ? 4 : bits, 0, true};
      SCOPED_TRACE(bits);
      LayerCaches a = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
      LayerCaches cpu = make_layer_caches({plan}, KVDType::kF16);
      const std::vector<float> k = testing::random_normal(size_t(600) * 2 * 128, 5);
      const std::vector<float> v = testing::random_normal(size_t(600) * 2 * 128, 6);
      a[0]->append(k.data(), v.data(), 600);
      cpu[0]->append(k.data(), v.data(), 600);
      const int64_t blocks_before = context.pool().stats().blocks_in_use;
      std::shared_ptr<const KVRows> rows = a[0]->copy_rows(0, 512);
      ASSERT_NE(dynamic_cast<const DeviceKVRows*>(rows.get()), nullptr);
      EXPECT_EQ(context.pool().stats().blocks_in_use, blocks_before);  // nothing copied
      LayerCaches b = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
      ByteWriter state;
      a[0]->write_state(state);
      ByteReader state_in(state.buffer().data(), state.buffer().size());
      b[0]->read_state(state_in);
      b[0]->append_rows(*rows);
      ASSERT_EQ(b[0]->size(), 512);
      // b continues from token 512 exactly as a CPU cache would.
      LayerCaches cpu_b = make_layer_caches({plan}, KVDType::kF16);
      cpu_b[0]->append(k.data(), v.data(), 600);
      cpu_b[0]->trim(88);
      cpu_b[0]->append(k.data() + size_t(512) * 256, v.data() + size_t(512) * 256, 88);
      b[0]->append(k.data() + size_t(512) * 256, v.data() + size_t(512) * 256, 88);
      EXPECT_EQ(saved(*b[0]), saved(*cpu_b[0]));
      // A trim of b into the shared block copies it before b writes again; a is untouched.
      b[0]->trim(100);
      const std::vector<float> other = testing::random_normal(size_t(10) * 2 * 128, 7);
      b[0]->append(other.data(), other.data(), 10);
      EXPECT_EQ(saved(*a[0]), saved(*cpu[0]));
      rows.reset();
    }
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace turbokv::cuda
