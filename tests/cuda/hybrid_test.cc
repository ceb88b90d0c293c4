// The GPU forward of the hybrid families (model/cuda/hybrid_forward.h) against references we did
// not write and against the CPU engine:
//  - the Gated DeltaNet kernels against the CPU steps and the double-precision reference
//    (model/linear_attention.h);
//  - qwen3_5_text, gemma4_text and deepseek_v3 fixtures: logits within 1e-4 of transformers' and
//    its greedy tokens, fp32 weights and dense fp32 caches;
//  - with --kv-bits 3.5: every layer's cache type as on the CPU, and logits and greedy tokens
//    agreeing with the CPU engine's;
//  - batched decode of sequences at different depths, each with its own recurrent state,
//    against each sequence run alone on the CPU;
//  - the recurrent state refuses what it cannot do (trim, save, prefix sharing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/safetensors.h"
#include "eval/perplexity.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/hybrid_ops.h"
#include "kernels/cuda/linear_attention.h"
#include "kv/byte_io.h"
#include "kv/cache_policy.h"
#include "kv/dense_kv_cache.h"
#include "kv/kv_resolve.h"
#include "model/cuda/cuda_decoder.h"
#include "model/cuda/device_latent_cache.h"
#include "model/cuda/device_recurrent_state.h"
#include "model/decoder.h"
#include "model/linear_attention.h"
#include "model/mla.h"
#include "test_util.h"
#include "tests/model/golden.h"

namespace turbokv::cuda {
namespace {

using testing::CudaTest;
using testing::random_normal;

std::string fixture(const std::string& rel) {
  return std::string(TURBOKV_SOURCE_DIR) + "/tests/fixtures/" + rel;
}

std::unique_ptr<CudaDecoderModel> load_gpu(const std::string& dir) {
  std::unique_ptr<Model> model = Model::load(dir);
  auto* decoder = dynamic_cast<DecoderModel*>(model.release());
  CudaModelOptions options;
  options.kv_cache_bytes = size_t(256) << 20;
  return std::make_unique<CudaDecoderModel>(std::unique_ptr<DecoderModel>(decoder), options);
}

ResolvedKV kv_bits(double bits, bool last_layer_dense) {
  KVOptions o;
  o.kv_bits = bits;
  o.last_layer_dense = last_layer_dense;
  return resolve_kv_options(o);
}

LayerKind cpu_config_kind(const Model& model, int layer) {
  return dynamic_cast<const DecoderModel&>(model).config().layer_kind[size_t(layer)];
}

// For n = 1 .. the depth of dir's model: writes at tmp a model directory holding dir's weights
// and its config cut to the first n layers (gemma4 without per-layer inputs until its full
// depth, which their table needs), then calls fn(n).
void for_each_layer_prefix(const std::string& dir, const std::string& tmp,
                           const std::function<void(int n)>& fn) {
  std::ifstream in(dir + "/config.json");
  const nlohmann::json full = nlohmann::json::parse(in);
  const int layers = full.at("num_hidden_layers").get<int>();
  std::filesystem::create_directories(tmp);
  std::filesystem::copy_file(dir + "/model.safetensors", tmp + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  for (int n = 1; n <= layers; ++n) {
    nlohmann::json cut = full;
    cut["num_hidden_layers"] = n;
    if (cut.contains("layer_types") && cut["layer_types"].is_array()) {
      cut["layer_types"] =
          std::vector<std::string>(cut["layer_types"].begin(), cut["layer_types"].begin() + n);
    }
    if (n < layers && cut.contains("num_kv_shared_layers")) {
      // The full model's KV-shared layers (which have no k/v weights) stay shared, reading the
      // same earlier layers; the per-layer input table is sized for the full depth.
      const int shared = full.at("num_kv_shared_layers").get<int>();
      cut["num_kv_shared_layers"] = std::max(0, n - (layers - shared));
      cut["hidden_size_per_layer_input"] = 0;
    }
    std::ofstream(tmp + "/config.json") << cut.dump();
    fn(n);
  }
}

// Admission's promise for one sequence covers what its caches take from the pool: the bytes
// in use after make_caches and after each forward of a prefill and decode steps never exceed
// kv_bytes_for at that many tokens (KV blocks, recurrent states, the state blocks of centered,
// sink-keeping or recent-token layers: their rings of W - 1 rows). A setting the GPU refuses for
// the model is reported and skipped.
void expect_admission_covers_pool_use(const CudaDecoderModel& gpu, const std::string& what) {
  KVOptions levers;
  levers.kv_bits = 3.5;
  levers.last_layer_dense = false;
  levers.kv_centering = "both";
  levers.kv_sink_tokens = 128;
  ResolvedKV recent = resolve_kv_options(levers);
  recent.recent_tokens = 1024;
  const std::vector<std::pair<std::string, ResolvedKV>> settings = {
      {"dense", ResolvedKV{}},
      {"3.5, every layer", kv_bits(3.5, false)},
      {"3.5, centered, 128 sink tokens", resolve_kv_options(levers)},
      {"3.5, centered, 128 sink tokens, 1024 recent tokens", recent}};
  const DeviceBlockPool& pool = gpu.cache_context().pool();
  const int V = gpu.info().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 80; ++i) ids.push_back((i * 31 + 3) % V);
  std::vector<float> logits(size_t(V) * ids.size());
  for (const auto& [name, kv] : settings) {
    SCOPED_TRACE(what + ", " + name);
    const size_t before = pool.stats().used_bytes;
    LayerCaches caches;
    try {
      caches = gpu.make_caches(kv);
    } catch (const Unsupported& e) {
      std::printf("  %s, %s: not on the GPU (%s)\n", what.c_str(), name.c_str(), e.what());
      continue;
    }
    EXPECT_LE(pool.stats().used_bytes - before, gpu.kv_bytes_for(kv, 0)) << "no tokens yet";
    int64_t tokens = 0;
    for (int n : {70, 1, 1, 8}) {
      Model::Chunk c{ids.data() + tokens, n, &caches, logits.data(), false};
      gpu.forward({&c, 1});
      tokens += n;
      EXPECT_LE(pool.stats().used_bytes - before, gpu.kv_bytes_for(kv, tokens))
          << tokens << " tokens";
    }
  }
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, double(std::abs(a[i] - b[i])));
  }
  return a.size() == b.size() ? d : INFINITY;
}

// ------------------------------------------------------------------ Gated DeltaNet kernels

class GatedDeltaKernels : public CudaTest,
                          public ::testing::WithParamInterface<std::pair<int, int>> {};

// Random operands as gated_delta_prepare leaves them (unit q, k; g < 0; beta in (0, 1)).
struct DeltaCase {
  GatedDeltaShape shape;
  int64_t T;
  std::vector<float> qkv, g, beta;  // [T, 2 Hk dk + Hv dv], [T, Hv], [T, Hv]
  int64_t width() const {
    return 2 * int64_t(shape.key_heads) * shape.k_dim + int64_t(shape.value_heads) * shape.v_dim;
  }
};

DeltaCase make_case(int dk, int dv, int64_t T, uint64_t seed) {
  DeltaCase c;
  c.shape = GatedDeltaShape{2, 4, dk, dv};
  c.T = T;
  c.qkv = random_normal(size_t(T * c.width()), seed);
  std::vector<float> a = random_normal(size_t(T * 4), seed + 1);
  std::vector<float> b = random_normal(size_t(T * 4), seed + 2);
  const std::vector<float> a_log = {-0.5f, 0.1f, 0.3f, -1.0f}, dt_bias = {0.2f, -0.1f, 0.0f, 0.5f};
  turbokv::gated_delta_prepare(c.qkv.data(), a.data(), b.data(), T, c.shape, a_log.data(),
                               dt_bias.data());
  c.g = a;
  c.beta = b;
  return c;
}

GatedDeltaInputs host_inputs(const DeltaCase& c, int64_t t0, int64_t n) {
  const int64_t key_dim = int64_t(c.shape.key_heads) * c.shape.k_dim, w = c.width();
  const float* base = c.qkv.data() + t0 * w;
  return GatedDeltaInputs{base, base + key_dim,      base + 2 * key_dim,     w,
                          w,    c.g.data() + t0 * 4, c.beta.data() + t0 * 4, n};
}

// Prefill of 37 tokens token by token, then two single-token steps, on one device state,
// against the double-precision reference carried the same way.
TEST_P(GatedDeltaKernels, RecurrentKernelMatchesTheReference) {
  const auto [dk, dv] = GetParam();
  const DeltaCase c = make_case(dk, dv, 39, 7);
  const GatedDeltaDims dims{c.shape.key_heads, c.shape.value_heads, dk, dv};
  const int64_t w = c.width(), key_dim = 2 * dk;
  DeviceBuffer<float> qkv = DeviceBuffer<float>::upload(c.qkv);
  DeviceBuffer<float> g = DeviceBuffer<float>::upload(c.g);
  DeviceBuffer<float> beta = DeviceBuffer<float>::upload(c.beta);
  const std::vector<float> state0 = random_normal(size_t(4) * dk * dv, 11, 0.3f);
  DeviceBuffer<float> state = DeviceBuffer<float>::upload(state0);
  DeviceBuffer<float> out(size_t(c.T) * 4 * dv);
  std::vector<float> ref_state = state0, ref_out(size_t(c.T) * 4 * dv);
  for (auto [t0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 37}, {37, 1}, {38, 1}}) {
    GatedDeltaRows in;
    in.q = qkv.data() + t0 * w;
    in.k = in.q + key_dim;
    in.v = in.q + 2 * key_dim;
    in.qk_stride = in.v_stride = w;
    in.g = g.data() + t0 * 4;
    in.beta = beta.data() + t0 * 4;
    in.T = n;
    gated_delta_recurrent(in, dims, state.data(), out.data() + t0 * 4 * dv, nullptr);
    turbokv::gated_delta_ref(host_inputs(c, t0, n), c.shape, ref_state.data(),
                             ref_out.data() + t0 * 4 * dv);
  }
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(max_abs_diff(out.download(), ref_out), 2e-5);
  EXPECT_LT(max_abs_diff(state.download(), ref_state), 2e-5);
}

// The chunked kernel: 70 tokens (two whole chunks and a tail), one token by the recurrence,
// then 37 more chunked, on one device state, against the double reference carried the same way.
TEST_P(GatedDeltaKernels, ChunkedKernelMatchesTheReference) {
  const auto [dk, dv] = GetParam();
  const DeltaCase c = make_case(dk, dv, 108, 9);
  const GatedDeltaDims dims{c.shape.key_heads, c.shape.value_heads, dk, dv};
  const int64_t w = c.width(), key_dim = 2 * dk;
  DeviceBuffer<float> qkv = DeviceBuffer<float>::upload(c.qkv);
  DeviceBuffer<float> g = DeviceBuffer<float>::upload(c.g);
  DeviceBuffer<float> beta = DeviceBuffer<float>::upload(c.beta);
  const std::vector<float> state0 = random_normal(size_t(4) * dk * dv, 13, 0.3f);
  DeviceBuffer<float> state = DeviceBuffer<float>::upload(state0);
  DeviceBuffer<float> out(size_t(c.T) * 4 * dv);
  std::vector<float> ref_state = state0, ref_out(size_t(c.T) * 4 * dv);
  for (auto [t0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 70}, {70, 1}, {71, 37}}) {
    GatedDeltaRows in;
    in.q = qkv.data() + t0 * w;
    in.k = in.q + key_dim;
    in.v = in.q + 2 * key_dim;
    in.qk_stride = in.v_stride = w;
    in.g = g.data() + t0 * 4;
    in.beta = beta.data() + t0 * 4;
    in.T = n;
    if (n == 1) {
      gated_delta_recurrent(in, dims, state.data(), out.data() + t0 * 4 * dv, nullptr);
    } else {
      gated_delta_chunked(in, dims, state.data(), out.data() + t0 * 4 * dv, nullptr);
    }
    turbokv::gated_delta_ref(host_inputs(c, t0, n), c.shape, ref_state.data(),
                             ref_out.data() + t0 * 4 * dv);
  }
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(max_abs_diff(out.download(), ref_out), 2e-5);
  EXPECT_LT(max_abs_diff(state.download(), ref_state), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Dims, GatedDeltaKernels,
                         ::testing::Values(std::make_pair(16, 16), std::make_pair(32, 48),
                                           std::make_pair(128, 128), std::make_pair(24, 40)));

// The conv (two chunks, the second shorter than the history), prepare and gated norm against
// the CPU steps.
class HybridKernels : public CudaTest {};

TEST_F(HybridKernels, ConvPrepareAndGatedNormMatchTheCpuSteps) {
  const int C = 96, K = 4;
  const GatedDeltaShape shape{2, 4, 8, 16};  // 2*2*8 + 4*16 = 96 channels
  const GatedDeltaDims dims{2, 4, 8, 16};
  const std::vector<float> weight = random_normal(size_t(C) * K, 1, 0.5f);
  std::vector<float> history(size_t(K - 1) * C, 0.0f);
  DeviceBuffer<float> d_weight = DeviceBuffer<float>::upload(weight);
  DeviceBuffer<float> d_history = DeviceBuffer<float>::upload(history);
  for (int64_t T : {9, 2}) {
    const std::vector<float> x = random_normal(size_t(T) * C, 10 + uint64_t(T));
    std::vector<float> want(x.size());
    turbokv::causal_conv1d_silu(x.data(), T, C, K, weight.data(), history.data(), want.data());
    DeviceBuffer<float> d_x = DeviceBuffer<float>::upload(x);
    DeviceBuffer<float> d_out(x.size());
    causal_conv1d_silu(d_x.data(), T, C, K, d_weight.data(), d_history.data(), d_out.data(),
                       nullptr);
    TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(max_abs_diff(d_out.download(), want), 1e-5) << "conv, T " << T;
    EXPECT_LT(max_abs_diff(d_history.download(), history), 0.0 + 1e-12) << "history, T " << T;

    std::vector<float> a = random_normal(size_t(T) * 4, 20), b = random_normal(size_t(T) * 4, 21);
    const std::vector<float> a_log = {-0.5f, 0.1f, 0.3f, -1.0f},
                             dt_bias = {0.2f, -0.1f, 0.0f, 0.5f};
    DeviceBuffer<float> d_qkv = DeviceBuffer<float>::upload(want);
    DeviceBuffer<float> d_a = DeviceBuffer<float>::upload(a), d_b = DeviceBuffer<float>::upload(b);
    DeviceBuffer<float> d_alog = DeviceBuffer<float>::upload(a_log);
    DeviceBuffer<float> d_dt = DeviceBuffer<float>::upload(dt_bias);
    std::vector<float> qkv = want;
    turbokv::gated_delta_prepare(qkv.data(), a.data(), b.data(), T, shape, a_log.data(),
                                 dt_bias.data());
    gated_delta_prepare(d_qkv.data(), d_a.data(), d_b.data(), T, dims, d_alog.data(), d_dt.data(),
                        nullptr);
    TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(max_abs_diff(d_qkv.download(), qkv), 1e-5) << "prepare q, k";
    EXPECT_LT(max_abs_diff(d_a.download(), a), 1e-5) << "prepare g";
    EXPECT_LT(max_abs_diff(d_b.download(), b), 1e-5) << "prepare beta";

    std::vector<float> core = random_normal(size_t(T) * 64, 30);
    const std::vector<float> z = random_normal(core.size(), 31), nw = random_normal(16, 32);
    DeviceBuffer<float> d_core = DeviceBuffer<float>::upload(core);
    DeviceBuffer<float> d_z = DeviceBuffer<float>::upload(z),
                        d_nw = DeviceBuffer<float>::upload(nw);
    turbokv::gated_rms_norm(core.data(), z.data(), T * 4, 16, nw.data(), 1e-6f);
    gated_rms_norm(d_core.data(), d_z.data(), T * 4, 16, d_nw.data(), 1e-6f, nullptr);
    TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(max_abs_diff(d_core.download(), core), 1e-5) << "gated norm";
  }
}

// The row ops of hybrid_ops.h against the obvious host loops (mla.h's deinterleave_pairs for the
// pair order).
TEST_F(HybridKernels, RowOpsMatchHostLoops) {
  const int64_t T = 5;
  const int heads = 3, hd = 4;
  const std::vector<float> qg = random_normal(size_t(T) * heads * 2 * hd, 40);
  DeviceBuffer<float> d_qg = DeviceBuffer<float>::upload(qg);
  const int64_t q_ld = heads * hd + 7;
  DeviceBuffer<float> d_q(size_t(T * q_ld)), d_gate(size_t(T) * heads * hd);
  split_query_gate(d_qg.data(), T, heads, hd, d_q.data(), q_ld, d_gate.data(), nullptr);
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> q = d_q.download(), gate = d_gate.download();
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int e = 0; e < hd; ++e) {
        const float* src = qg.data() + (t * heads + h) * 2 * hd;
        ASSERT_EQ(q[size_t(t * q_ld + h * hd + e)], src[e]);
        ASSERT_EQ(gate[size_t((t * heads + h) * hd + e)], src[hd + e]);
      }
    }
  }
  // copy_cols, then sigmoid_gate, add_sigmoid_gated_rows, scale, add_scale.
  DeviceBuffer<float> d_dst(size_t(T) * 6);
  copy_cols(d_qg.data() + 2, 2 * heads * hd, d_dst.data(), 6, T, 6, nullptr);
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> dst = d_dst.download();
  for (int64_t t = 0; t < T; ++t) {
    for (int c = 0; c < 6; ++c) {
      ASSERT_EQ(dst[size_t(t * 6 + c)], qg[size_t(t * 2 * heads * hd + 2 + c)]);
    }
  }
  std::vector<float> x = random_normal(size_t(T) * 6, 41), y = random_normal(x.size(), 42),
                     g = random_normal(x.size(), 43), row_gate = random_normal(size_t(T), 44);
  DeviceBuffer<float> d_x = DeviceBuffer<float>::upload(x), d_y = DeviceBuffer<float>::upload(y),
                      d_g = DeviceBuffer<float>::upload(g),
                      d_rg = DeviceBuffer<float>::upload(row_gate);
  sigmoid_gate(d_x.data(), d_g.data(), int64_t(x.size()), nullptr);
  add_sigmoid_gated_rows(d_x.data(), d_y.data(), d_rg.data(), T, 6, nullptr);
  scale(d_x.data(), int64_t(x.size()), 0.5f, nullptr);
  add_scale(d_x.data(), d_y.data(), int64_t(x.size()), 3.0f, nullptr);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] *= 1.0f / (1.0f + std::exp(-g[i]));
    x[i] += y[i] / (1.0f + std::exp(-row_gate[i / 6]));
    x[i] = (x[i] * 0.5f + y[i]) * 3.0f;
  }
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(max_abs_diff(d_x.download(), x), 1e-5);
  // deinterleave_pairs on rows of stride 10 (8 rotary dims, 2 untouched).
  std::vector<float> r = random_normal(size_t(T) * 10, 45);
  DeviceBuffer<float> d_r = DeviceBuffer<float>::upload(r);
  deinterleave_pairs(d_r.data(), T, 10, 8, nullptr);
  for (int64_t t = 0; t < T; ++t) turbokv::deinterleave_pairs(r.data() + t * 10, 1, 8);
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d_r.download(), r);
}

// The contiguous latent cache (MLA rows above 256 dims) against the CPU's dense cache holding the
// same rows as keys and values: appends across sizes, prefill and decode queries.
TEST_F(HybridKernels, WideLatentCacheAttendsAsTheCpuDenseCache) {
  for (DenseElem elem : {DenseElem::kF32, DenseElem::kF16}) {
    const int d = 576;
    DenseKVCache cpu(1, d, elem == DenseElem::kF32 ? KVDType::kF32 : KVDType::kF16);
    DeviceLatentCache gpu(d, elem, nullptr);
    EXPECT_EQ(gpu.type_name(), cpu.type_name());
    uint64_t seed = 50;
    for (int n : {70, 1, 300, 1}) {
      const std::vector<float> rows = random_normal(size_t(n) * d, seed++);
      cpu.append(rows.data(), rows.data(), n);
      gpu.append(rows.data(), rows.data(), n);
      for (int n_q : {1, 5}) {
        AttentionParams params;
        params.n_heads = 8;
        params.scale = 0.05f;
        const std::vector<float> q = random_normal(size_t(n_q) * 8 * d, seed++);
        std::vector<float> want(q.size()), got(q.size());
        cpu.attend(q.data(), n_q, params, want.data());
        gpu.attend(q.data(), n_q, params, got.data());
        EXPECT_LT(testing::max_row_relative_error(got, want, d), 1e-4)
            << "elem " << int(elem) << ", " << gpu.size() << " rows, " << n_q << " queries";
      }
    }
    EXPECT_EQ(gpu.nbytes(), size_t(gpu.size()) * d * (elem == DenseElem::kF32 ? 4 : 2));
    EXPECT_THROW(
        gpu.append(random_normal(size_t(d), 1).data(), random_normal(size_t(d), 2).data(), 1),
        InvalidArgument);
    ByteWriter w;
    EXPECT_THROW(gpu.save(w), Unsupported);
  }
}

// ------------------------------------------------------------------------ whole models

class HybridGolden : public CudaTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(HybridGolden, LogitsAndGreedyTokensMatchTransformers) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  auto gpu = load_gpu(dir);
  turbokv::testing::check_golden(
      *gpu, [&] { return gpu->make_caches(ResolvedKV{}, DenseElem::kF32); },
      dir + "/reference.safetensors", 1e-4f, GetParam());
}

// With --kv-bits 3.5 (the last attention layer quantized too, so that every family has a
// TurboQuant layer where it has a global one): the GPU's cache types are the CPU's, layer by
// layer, and the logits of a prefill and 8 decode steps agree with the CPU engine's.
TEST_P(HybridGolden, AgreesWithTheCpuEngineUnderTurboQuant) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  auto gpu = load_gpu(dir);
  std::unique_ptr<Model> cpu = Model::load(dir);
  for (bool last_dense : {true, false}) {
    SCOPED_TRACE(last_dense ? "last attention layer dense" : "every global layer quantized");
    const ResolvedKV kv = kv_bits(3.5, last_dense);
    LayerCaches cpu_caches = make_layer_caches(cpu->layer_specs(), kv, KVDType::kF32);
    LayerCaches gpu_caches = gpu->make_caches(kv, DenseElem::kF32);
    ASSERT_EQ(cpu_caches.size(), gpu_caches.size());
    for (size_t l = 0; l < cpu_caches.size(); ++l) {
      EXPECT_EQ(gpu_caches[l]->type_name(), cpu_caches[l]->type_name()) << "layer " << l;
    }
    const int V = cpu->info().vocab_size;
    std::vector<int32_t> ids;
    for (int i = 0; i < 30; ++i) ids.push_back((i * 37 + 11) % V);
    std::vector<float> want(ids.size() * size_t(V)), got(want.size());
    Model::Chunk a{ids.data(), 22, &cpu_caches, want.data(), true};
    Model::Chunk b{ids.data(), 22, &gpu_caches, got.data(), true};
    cpu->forward({&a, 1});
    gpu->forward({&b, 1});
    for (int i = 22; i < 30; ++i) {
      Model::Chunk sa{ids.data() + i, 1, &cpu_caches, want.data() + size_t(i) * V, true};
      Model::Chunk sb{ids.data() + i, 1, &gpu_caches, got.data() + size_t(i) * V, true};
      cpu->forward({&sa, 1});
      gpu->forward({&sb, 1});
    }
    for (float v : got) ASSERT_TRUE(std::isfinite(v));
    const double diff = max_abs_diff(got, want);
    std::printf("  %s kv 3.5%s: largest logit difference GPU vs CPU %.3g\n", GetParam(),
                last_dense ? "" : " (last quantized)", diff);
    // The codes of a key near a decision boundary may differ (the GPU's keys differ from the
    // CPU's by rounding), so the logits agree to 1e-2, not 1e-4; the greedy choice must agree
    // wherever the CPU's top token leads the next by more than that.
    constexpr double kTolerance = 1e-2;
    EXPECT_LT(diff, kTolerance);
    for (int i = 0; i < 30; ++i) {
      const float* w = want.data() + size_t(i) * V;
      std::vector<float> sorted(w, w + V);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] <= 2 * kTolerance) continue;
      EXPECT_EQ(turbokv::testing::argmax(got.data() + size_t(i) * V, V),
                turbokv::testing::argmax(w, V))
          << "row " << i;
    }
    // Bytes per layer alike, but for rotating layers: the CPU's keeps the last chunk's tokens
    // beyond the window, the GPU's counts the window (it frees whole blocks).
    size_t cpu_kv = 0, gpu_kv = 0, cpu_state = 0, gpu_state = 0;
    for (size_t l = 0; l < cpu_caches.size(); ++l) {
      if (cpu_caches[l]->type_name() != "rotating") {
        EXPECT_EQ(gpu_caches[l]->nbytes(), cpu_caches[l]->nbytes()) << "layer " << l;
      }
      cpu_kv += cpu_caches[l]->nbytes();
      gpu_kv += gpu_caches[l]->nbytes();
      cpu_state += cpu_caches[l]->state_bytes();
      gpu_state += gpu_caches[l]->state_bytes();
    }
    EXPECT_LE(gpu_kv, cpu_kv);
    EXPECT_EQ(gpu_state, cpu_state);
  }
}

// Three sequences at different depths decode in one forward call per step (their prefills in
// one call too): each sequence's logits equal its own run alone on the CPU.
TEST_P(HybridGolden, BatchedSequencesKeepTheirOwnState) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  auto gpu = load_gpu(dir);
  std::unique_ptr<Model> cpu = Model::load(dir);
  const int V = cpu->info().vocab_size;
  const std::vector<int> prompt_len = {5, 17, 11};
  constexpr int kSteps = 6;
  std::vector<std::vector<int32_t>> ids(3);
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < prompt_len[size_t(s)] + kSteps; ++i) {
      ids[size_t(s)].push_back((i * (13 + 10 * s) + 3 * s + 5) % V);
    }
  }
  // Reference: each sequence alone on the CPU (prefill, then one token per step).
  std::vector<std::vector<float>> want(3), got(3);
  for (int s = 0; s < 3; ++s) {
    const int n = prompt_len[size_t(s)];
    want[size_t(s)].resize(size_t(n + kSteps) * V);
    got[size_t(s)].resize(want[size_t(s)].size());
    LayerCaches caches = make_layer_caches(cpu->layer_specs(), ResolvedKV{}, KVDType::kF32);
    Model::Chunk p{ids[size_t(s)].data(), n, &caches, want[size_t(s)].data(), true};
    cpu->forward({&p, 1});
    for (int i = n; i < n + kSteps; ++i) {
      Model::Chunk st{ids[size_t(s)].data() + i, 1, &caches, want[size_t(s)].data() + size_t(i) * V,
                      true};
      cpu->forward({&st, 1});
    }
  }
  std::vector<LayerCaches> caches;
  for (int s = 0; s < 3; ++s) caches.push_back(gpu->make_caches(ResolvedKV{}, DenseElem::kF32));
  std::vector<Model::Chunk> prefill;
  for (int s = 0; s < 3; ++s) {
    prefill.push_back(Model::Chunk{ids[size_t(s)].data(), prompt_len[size_t(s)], &caches[size_t(s)],
                                   got[size_t(s)].data(), true});
  }
  gpu->forward(prefill);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Model::Chunk> batch;
    for (int s = 0; s < 3; ++s) {
      const int i = prompt_len[size_t(s)] + step;
      batch.push_back(Model::Chunk{ids[size_t(s)].data() + i, 1, &caches[size_t(s)],
                                   got[size_t(s)].data() + size_t(i) * V, true});
    }
    gpu->forward(batch);
  }
  for (int s = 0; s < 3; ++s) {
    EXPECT_LT(max_abs_diff(got[size_t(s)], want[size_t(s)]), 1e-4) << "sequence " << s;
  }
}

// The first n layers of each fixture (a config cut to n layers over the same weights; gemma4
// without per-layer inputs until its full depth, which their table needs), GPU against CPU for
// every n: where a layer kind goes wrong on the GPU, the first n that differs names it.
TEST_P(HybridGolden, LayerPrefixesAgreeWithTheCpu) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  const std::string tmp = ::testing::TempDir() + "/hybrid_prefix_" + GetParam();
  for_each_layer_prefix(dir, tmp, [&](int n) {
    std::unique_ptr<Model> cpu = Model::load(tmp);
    auto gpu = load_gpu(tmp);
    const int V = cpu->info().vocab_size;
    std::vector<int32_t> ids;
    for (int i = 0; i < 20; ++i) ids.push_back((i * 29 + 7) % V);
    std::vector<float> want(ids.size() * size_t(V)), got(want.size());
    LayerCaches cc = make_layer_caches(cpu->layer_specs(), ResolvedKV{}, KVDType::kF32);
    LayerCaches gc = gpu->make_caches(ResolvedKV{}, DenseElem::kF32);
    Model::Chunk a{ids.data(), 16, &cc, want.data(), true};
    Model::Chunk b{ids.data(), 16, &gc, got.data(), true};
    cpu->forward({&a, 1});
    gpu->forward({&b, 1});
    for (int i = 16; i < 20; ++i) {
      Model::Chunk sa{ids.data() + i, 1, &cc, want.data() + size_t(i) * V, true};
      Model::Chunk sb{ids.data() + i, 1, &gc, got.data() + size_t(i) * V, true};
      cpu->forward({&sa, 1});
      gpu->forward({&sb, 1});
    }
    double prefill = 0, decode = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      double& d = i < size_t(16) * V ? prefill : decode;
      d = std::max(d, double(std::abs(got[i] - want[i])));
    }
    std::printf("  %s, first %d layers (last: %s): GPU vs CPU prefill %.3g, decode %.3g\n",
                GetParam(), n, layer_kind_name(cpu_config_kind(*cpu, n - 1)), prefill, decode);
    EXPECT_LT(std::max(prefill, decode), 1e-4) << "first " << n << " layers";
  });
}

// Every prefix of each family (so also models of linear-attention layers alone, whose whole
// pool use is recurrent states).
TEST_P(HybridGolden, AdmissionCoversWhatTheCachesTake) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  const std::string tmp = ::testing::TempDir() + "/hybrid_admission_" + GetParam();
  for_each_layer_prefix(dir, tmp, [&](int n) {
    expect_admission_covers_pool_use(*load_gpu(tmp), str_cat(GetParam(), ", first ", n, " layers"));
  });
}

// A plain Llama: its TurboQuant layers' state blocks (128 sink rows each) outweigh the spare
// block admission counts per layer.
TEST_F(HybridKernels, AdmissionCoversWhatLlamaCachesTake) {
  expect_admission_covers_pool_use(*load_gpu(fixture("hf-tiny/llama")), "llama");
}

// Perplexity on the GPU, dense and with --kv-bits 3.5 (every global layer quantized): finite, and
// equal to the CPU's run of the same tokens (the KLD on random weights only shows the path runs).
TEST_P(HybridGolden, PerplexityWithTurboQuantMatchesTheCpu) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  auto gpu = load_gpu(dir);
  std::unique_ptr<Model> cpu = Model::load(dir);
  const int V = cpu->info().vocab_size;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 2 * 64 + 1; ++i) tokens.push_back((i * 131 + 7) % V);
  PerplexityOptions options;
  options.context = 64;
  options.tokens_per_forward = 24;
  options.kv = kv_bits(3.5, false);
  const PerplexityResult want = run_perplexity(*cpu, tokens, options);
  options.make_caches = [&](const ResolvedKV& kv) { return gpu->make_caches(kv); };
  const PerplexityResult got = run_perplexity(*gpu, tokens, options);
  EXPECT_TRUE(std::isfinite(got.stats.ppl()) && std::isfinite(got.stats.dense_ppl()));
  EXPECT_TRUE(std::isfinite(got.stats.kld_mean()) && got.stats.kld_mean() >= 0);
  std::printf("  %s GPU: ppl dense %.5f (CPU %.5f), turboquant 3.5 %.5f (CPU %.5f), KLD %.3g\n",
              GetParam(), got.stats.dense_ppl(), want.stats.dense_ppl(), got.stats.ppl(),
              want.stats.ppl(), got.stats.kld_mean());
  // Dense layers at fp16 on both devices; the rest in fp32: close, not bitwise.
  EXPECT_NEAR(got.stats.dense_ppl(), want.stats.dense_ppl(), 1e-3 * want.stats.dense_ppl());
  EXPECT_NEAR(got.stats.ppl(), want.stats.ppl(), 1e-2 * want.stats.ppl());
}

// Writes tensors (fp32, row-major) as a safetensors file.
void write_safetensors(
    const std::string& path,
    const std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>>&
        ts) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const auto& [name, t] : ts) {
    const size_t bytes = t.second.size() * sizeof(float);
    header[name] = {
        {"dtype", "F32"}, {"shape", t.first}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& [name, t] : ts) {
    out.write(reinterpret_cast<const char*>(t.second.data()),
              std::streamsize(t.second.size() * sizeof(float)));
  }
}

// deepseek_v3 with a latent row of 272 dims (kv_lora_rank 240, qk_rope_head_dim 32: wider than
// the paged caches, as every real MLA checkpoint's 576), the fixture's other weights and random
// ones where the shapes change: GPU against CPU, prefill and decode, and batched.
TEST_F(HybridKernels, WideLatentModelAgreesWithTheCpu) {
  const std::string dir = fixture("hf-tiny/deepseek_v3");
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  const int r = 240, rope = 32, nope = config.at("qk_nope_head_dim").get<int>();
  const int heads = config.at("num_attention_heads").get<int>();
  const int vd = config.at("v_head_dim").get<int>(), H = config.at("hidden_size").get<int>();
  const int q_lora = config.at("q_lora_rank").get<int>();
  config["kv_lora_rank"] = r;
  config["qk_rope_head_dim"] = rope;
  config["qk_head_dim"] = nope + rope;
  config["head_dim"] = rope;
  const std::string tmp = ::testing::TempDir() + "/wide_latent";
  std::filesystem::create_directories(tmp);
  std::ofstream(tmp + "/config.json") << config.dump();
  const SafetensorsFile src = SafetensorsFile::open(dir + "/model.safetensors");
  std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> ts;
  uint64_t seed = 60;
  for (const TensorView& t : src.tensors()) {
    std::vector<int64_t> shape = t.shape;
    const auto ends = [&](const char* s) { return t.name.ends_with(s); };
    if (ends("kv_a_layernorm.weight")) shape = {r};
    if (ends("kv_a_proj_with_mqa.weight")) shape = {r + rope, H};
    if (ends("kv_b_proj.weight")) shape = {int64_t(heads) * (nope + vd), r};
    if (ends("q_b_proj.weight")) shape = {int64_t(heads) * (nope + rope), q_lora};
    if (shape == t.shape) {
      ts.push_back({t.name, {shape, SafetensorsFile::to_f32(t)}});
      continue;
    }
    int64_t count = 1;
    for (int64_t v : shape) count *= v;
    std::vector<float> w = random_normal(size_t(count), seed++, 0.1f);
    if (ends("layernorm.weight")) {
      for (float& v : w) v += 1.0f;
    }
    ts.push_back({t.name, {shape, w}});
  }
  write_safetensors(tmp + "/model.safetensors", ts);
  std::unique_ptr<Model> cpu = Model::load(tmp);
  auto gpu = load_gpu(tmp);
  const int V = cpu->info().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 41 + 3) % V);
  std::vector<float> want(ids.size() * size_t(V)), got(want.size());
  LayerCaches cc = make_layer_caches(cpu->layer_specs(), ResolvedKV{}, KVDType::kF32);
  LayerCaches gc = gpu->make_caches(ResolvedKV{}, DenseElem::kF32);
  for (size_t l = 0; l < cc.size(); ++l) {
    EXPECT_EQ(gc[l]->type_name(), cc[l]->type_name()) << "layer " << l;
  }
  Model::Chunk a{ids.data(), 18, &cc, want.data(), true};
  Model::Chunk b{ids.data(), 18, &gc, got.data(), true};
  cpu->forward({&a, 1});
  gpu->forward({&b, 1});
  for (int i = 18; i < 24; ++i) {
    Model::Chunk sa{ids.data() + i, 1, &cc, want.data() + size_t(i) * V, true};
    Model::Chunk sb{ids.data() + i, 1, &gc, got.data() + size_t(i) * V, true};
    cpu->forward({&sa, 1});
    gpu->forward({&sb, 1});
  }
  const double diff = max_abs_diff(got, want);
  std::printf("  deepseek_v3, 272-dim latent rows: largest logit difference GPU vs CPU %.3g\n",
              diff);
  EXPECT_LT(diff, 1e-4);
}

// qwen3_5 with the MoE variant's sparse MLP (fused expert tensors as transformers 5 writes
// them, a gated shared expert), random expert weights over the fixture's others: GPU against
// CPU (the CPU's MoE against transformers: the qwen3_5_moe_text fixture).
TEST_F(HybridKernels, Qwen3_5MoeModelAgreesWithTheCpu) {
  const std::string dir = fixture("hf-tiny/qwen3_5_text");
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  const int64_t H = config.at("hidden_size").get<int>(), E = 4, I = 32, S = 48;
  config["model_type"] = "qwen3_5_moe_text";
  config["num_experts"] = E;
  config["num_experts_per_tok"] = 2;
  config["moe_intermediate_size"] = I;
  config["shared_expert_intermediate_size"] = S;
  const std::string tmp = ::testing::TempDir() + "/qwen3_5_moe";
  std::filesystem::create_directories(tmp);
  std::ofstream(tmp + "/config.json") << config.dump();
  const SafetensorsFile src = SafetensorsFile::open(dir + "/model.safetensors");
  std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> ts;
  uint64_t seed = 70;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t v : shape) count *= v;
    ts.push_back({name, {shape, random_normal(size_t(count), seed++, 0.1f)}});
  };
  for (const TensorView& t : src.tensors()) {
    if (t.name.find(".mlp.") == std::string::npos) {
      ts.push_back({t.name, {t.shape, SafetensorsFile::to_f32(t)}});
    }
  }
  for (int l = 0; l < config.at("num_hidden_layers").get<int>(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    add(p + "gate.weight", {E, H});
    add(p + "experts.gate_up_proj", {E, 2 * I, H});
    add(p + "experts.down_proj", {E, H, I});
    add(p + "shared_expert.gate_proj.weight", {S, H});
    add(p + "shared_expert.up_proj.weight", {S, H});
    add(p + "shared_expert.down_proj.weight", {H, S});
    add(p + "shared_expert_gate.weight", {1, H});
  }
  write_safetensors(tmp + "/model.safetensors", ts);
  std::unique_ptr<Model> cpu = Model::load(tmp);
  auto gpu = load_gpu(tmp);
  const int V = cpu->info().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 43 + 9) % V);
  std::vector<float> want(ids.size() * size_t(V)), got(want.size());
  LayerCaches cc = make_layer_caches(cpu->layer_specs(), ResolvedKV{}, KVDType::kF32);
  LayerCaches gc = gpu->make_caches(ResolvedKV{}, DenseElem::kF32);
  Model::Chunk a{ids.data(), 18, &cc, want.data(), true};
  Model::Chunk b{ids.data(), 18, &gc, got.data(), true};
  cpu->forward({&a, 1});
  gpu->forward({&b, 1});
  for (int i = 18; i < 24; ++i) {
    Model::Chunk sa{ids.data() + i, 1, &cc, want.data() + size_t(i) * V, true};
    Model::Chunk sb{ids.data() + i, 1, &gc, got.data() + size_t(i) * V, true};
    cpu->forward({&sa, 1});
    gpu->forward({&sb, 1});
  }
  const double diff = max_abs_diff(got, want);
  std::printf("  qwen3_5_moe (random experts): largest logit difference GPU vs CPU %.3g\n", diff);
  EXPECT_LT(diff, 1e-4);
}

// gemma4 with keys-equal-values global layers of their own KV head count (attention_k_eq_v,
// one KV head of 32): no v_proj, V = v_norm of the raw keys; random k_proj for those layers over
// the fixture's other weights. GPU against CPU (the CPU against transformers: the
// gemma4_text_k_eq_v fixture).
TEST_F(HybridKernels, Gemma4KeysEqualValuesModelAgreesWithTheCpu) {
  const std::string dir = fixture("hf-tiny/gemma4_text");
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  const int64_t H = config.at("hidden_size").get<int>();
  config["attention_k_eq_v"] = true;
  std::vector<int> global;
  for (size_t l = 0; l < config.at("layer_types").size(); ++l) {
    if (config["layer_types"][l] == "full_attention") global.push_back(int(l));
  }
  for (int l : global) {
    config["per_layer_config"][std::to_string(l)] = {{"head_dim", 32}, {"num_key_value_heads", 1}};
  }
  const std::string tmp = ::testing::TempDir() + "/gemma4_k_eq_v";
  std::filesystem::create_directories(tmp);
  std::ofstream(tmp + "/config.json") << config.dump();
  const SafetensorsFile src = SafetensorsFile::open(dir + "/model.safetensors");
  std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> ts;
  uint64_t seed = 80;
  for (const TensorView& t : src.tensors()) {
    bool global_kv = false;
    for (int l : global) {
      const std::string a = "layers." + std::to_string(l) + ".self_attn.";
      global_kv |= t.name.find(a + "k_proj") != std::string::npos ||
                   t.name.find(a + "v_proj") != std::string::npos;
    }
    if (!global_kv) ts.push_back({t.name, {t.shape, SafetensorsFile::to_f32(t)}});
  }
  for (int l : global) {
    ts.push_back({"model.layers." + std::to_string(l) + ".self_attn.k_proj.weight",
                  {{32, H}, random_normal(size_t(32 * H), seed++, 0.1f)}});
  }
  write_safetensors(tmp + "/model.safetensors", ts);
  std::unique_ptr<Model> cpu = Model::load(tmp);
  ASSERT_TRUE(dynamic_cast<const DecoderModel&>(*cpu)
                  .config()
                  .attention[size_t(global[0])]
                  .values_from_keys);
  auto gpu = load_gpu(tmp);
  const int V = cpu->info().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 47 + 5) % V);
  std::vector<float> want(ids.size() * size_t(V)), got(want.size());
  LayerCaches cc = make_layer_caches(cpu->layer_specs(), ResolvedKV{}, KVDType::kF32);
  LayerCaches gc = gpu->make_caches(ResolvedKV{}, DenseElem::kF32);
  Model::Chunk a{ids.data(), 18, &cc, want.data(), true};
  Model::Chunk b{ids.data(), 18, &gc, got.data(), true};
  cpu->forward({&a, 1});
  gpu->forward({&b, 1});
  for (int i = 18; i < 24; ++i) {
    Model::Chunk sa{ids.data() + i, 1, &cc, want.data() + size_t(i) * V, true};
    Model::Chunk sb{ids.data() + i, 1, &gc, got.data() + size_t(i) * V, true};
    cpu->forward({&sa, 1});
    gpu->forward({&sb, 1});
  }
  const double diff = max_abs_diff(got, want);
  std::printf("  gemma4 keys = values: largest logit difference GPU vs CPU %.3g\n", diff);
  EXPECT_LT(diff, 1e-4);
}

// Long prompts: prefills of 150 tokens (several of the CPU's delta-rule chunks, and beyond the
// sliding windows) in one piece and as 100 + 50, then decode steps: GPU against CPU.
TEST_P(HybridGolden, LongPrefillAgreesWithTheCpu) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  auto gpu = load_gpu(dir);
  std::unique_ptr<Model> cpu = Model::load(dir);
  const int V = cpu->info().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 154; ++i) ids.push_back((i * 97 + 31) % V);
  for (const std::vector<int>& pieces : {std::vector<int>{150}, std::vector<int>{100, 50}}) {
    std::vector<float> want(ids.size() * size_t(V)), got(want.size());
    LayerCaches cc = make_layer_caches(cpu->layer_specs(), ResolvedKV{}, KVDType::kF32);
    LayerCaches gc = gpu->make_caches(ResolvedKV{}, DenseElem::kF32);
    int at = 0;
    for (int n : pieces) {
      Model::Chunk a{ids.data() + at, n, &cc, want.data() + size_t(at) * V, true};
      Model::Chunk b{ids.data() + at, n, &gc, got.data() + size_t(at) * V, true};
      cpu->forward({&a, 1});
      gpu->forward({&b, 1});
      at += n;
    }
    for (int i = at; i < int(ids.size()); ++i) {
      Model::Chunk sa{ids.data() + i, 1, &cc, want.data() + size_t(i) * V, true};
      Model::Chunk sb{ids.data() + i, 1, &gc, got.data() + size_t(i) * V, true};
      cpu->forward({&sa, 1});
      gpu->forward({&sb, 1});
    }
    const double diff = max_abs_diff(got, want);
    std::printf("  %s, prefill in %zu piece(s) of 150 tokens: GPU vs CPU %.3g\n", GetParam(),
                pieces.size(), diff);
    // 150 tokens through the CPU's chunked delta rule and the GPU's recurrence: two exact forms
    // summing in different orders, so the rounding differences grow with the prompt (1.2e-4 seen
    // on qwen3_5_text, 5e-5 or less elsewhere; the reference checks stay at 1e-4).
    EXPECT_LT(diff, 5e-4) << pieces.size() << " pieces";
  }
}

// The fixture with every tensor in bf16 (as real checkpoints are): the GPU narrows each GEMM's
// input to bf16 (the CPU widens the weights and keeps fp32 activations), so the distributions
// move by bf16 rounding, and no more.
TEST_P(HybridGolden, Bf16WeightsAgreeWithTheCpu) {
  const std::string dir = fixture(std::string("hf-tiny/") + GetParam());
  const std::string tmp = ::testing::TempDir() + "/bf16_" + GetParam();
  std::filesystem::create_directories(tmp);
  std::filesystem::copy_file(dir + "/config.json", tmp + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  {
    const SafetensorsFile src = SafetensorsFile::open(dir + "/model.safetensors");
    nlohmann::json header = nlohmann::json::object();
    std::vector<uint16_t> data;
    for (const TensorView& t : src.tensors()) {
      const std::vector<float> f = SafetensorsFile::to_f32(t);
      header[t.name] = {{"dtype", "BF16"},
                        {"shape", t.shape},
                        {"data_offsets", {data.size() * 2, (data.size() + f.size()) * 2}}};
      for (float v : f) data.push_back(f32_to_bf16(v));
    }
    std::string text = header.dump();
    while (text.size() % 8 != 0) text += ' ';
    std::ofstream out(tmp + "/model.safetensors", std::ios::binary);
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(text.size()));
    out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size() * 2));
  }
  std::unique_ptr<Model> cpu = Model::load(tmp);
  auto gpu = load_gpu(tmp);
  const int V = cpu->info().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 53 + 17) % V);
  std::vector<float> want(ids.size() * size_t(V)), got(want.size());
  LayerCaches cc = make_layer_caches(cpu->layer_specs(), ResolvedKV{}, KVDType::kF32);
  LayerCaches gc = gpu->make_caches(ResolvedKV{}, DenseElem::kF32);
  Model::Chunk a{ids.data(), 34, &cc, want.data(), true};
  Model::Chunk b{ids.data(), 34, &gc, got.data(), true};
  cpu->forward({&a, 1});
  gpu->forward({&b, 1});
  for (int i = 34; i < 40; ++i) {
    Model::Chunk sa{ids.data() + i, 1, &cc, want.data() + size_t(i) * V, true};
    Model::Chunk sb{ids.data() + i, 1, &gc, got.data() + size_t(i) * V, true};
    cpu->forward({&sa, 1});
    gpu->forward({&sb, 1});
  }
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
  // Mean KL(CPU || GPU) of the next-token distributions. Rounding the weights themselves to bf16
  // moves these random models by a mean KL of 3e-4 to 2e-3 (CPU against the fp32 reference);
  // rounding the activations too must not do much worse.
  double kl = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    const float* p = want.data() + r * V;
    const float* q = got.data() + r * V;
    const double mp = *std::max_element(p, p + V), mq = *std::max_element(q, q + V);
    double zp = 0, zq = 0;
    for (int i = 0; i < V; ++i) {
      zp += std::exp(double(p[i]) - mp);
      zq += std::exp(double(q[i]) - mq);
    }
    for (int i = 0; i < V; ++i) {
      const double lp = double(p[i]) - mp - std::log(zp), lq = double(q[i]) - mq - std::log(zq);
      kl += std::exp(lp) * (lp - lq);
    }
  }
  kl /= double(ids.size());
  std::printf("  %s, bf16 weights: GPU vs CPU largest logit difference %.3g, mean KL %.3g\n",
              GetParam(), max_abs_diff(got, want), kl);
  EXPECT_LT(kl, 1e-2);
}

// gemma4 with 288-dim global heads (wider than the paged formats, as gemma-4-31b's 512): those
// layers get contiguous dense caches, GPU against CPU with dense caches and with --kv-bits 3.5
// (where layer 2, the cache the last layer reads, stays dense); quantizing such a layer is
// refused by name.
TEST_F(HybridKernels, Gemma4WideGlobalHeadsAgreeWithTheCpu) {
  const std::string dir = fixture("hf-tiny/gemma4_text");
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  const int64_t H = config.at("hidden_size").get<int>(), D = 288;
  const int64_t heads = config.at("num_attention_heads").get<int>();
  const int64_t kvh = config.at("num_key_value_heads").get<int>();
  std::vector<int> global;
  for (size_t l = 0; l < config.at("layer_types").size(); ++l) {
    if (config["layer_types"][l] == "full_attention") global.push_back(int(l));
  }
  for (int l : global) config["per_layer_config"][std::to_string(l)] = {{"head_dim", D}};
  const std::string tmp = ::testing::TempDir() + "/gemma4_wide";
  std::filesystem::create_directories(tmp);
  std::ofstream(tmp + "/config.json") << config.dump();
  const SafetensorsFile src = SafetensorsFile::open(dir + "/model.safetensors");
  std::vector<std::pair<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>> ts;
  uint64_t seed = 90;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean) {
    int64_t count = 1;
    for (int64_t v : shape) count *= v;
    std::vector<float> w = random_normal(size_t(count), seed++, 0.1f);
    for (float& v : w) v += mean;
    ts.push_back({name, {shape, w}});
  };
  for (const TensorView& t : src.tensors()) {
    bool replaced = false;
    for (int l : global) {
      replaced |= t.name.find("layers." + std::to_string(l) + ".self_attn.") != std::string::npos;
    }
    if (!replaced) ts.push_back({t.name, {t.shape, SafetensorsFile::to_f32(t)}});
  }
  for (int l : global) {
    const std::string a = "model.layers." + std::to_string(l) + ".self_attn.";
    add(a + "q_proj.weight", {heads * D, H}, 0);
    add(a + "o_proj.weight", {H, heads * D}, 0);
    add(a + "q_norm.weight", {D}, 1);
    add(a + "k_proj.weight", {kvh * D, H}, 0);
    add(a + "v_proj.weight", {kvh * D, H}, 0);
    add(a + "k_norm.weight", {D}, 1);
  }
  write_safetensors(tmp + "/model.safetensors", ts);
  std::unique_ptr<Model> cpu = Model::load(tmp);
  auto gpu = load_gpu(tmp);
  EXPECT_THROW(gpu->make_caches(kv_bits(3.5, false), DenseElem::kF32), Unsupported);
  const int V = cpu->info().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back((i * 59 + 13) % V);
  for (const ResolvedKV& kv : {ResolvedKV{}, kv_bits(3.5, true)}) {
    std::vector<float> want(ids.size() * size_t(V)), got(want.size());
    LayerCaches cc = make_layer_caches(cpu->layer_specs(), kv, KVDType::kF32);
    LayerCaches gc = gpu->make_caches(kv, DenseElem::kF32);
    for (size_t l = 0; l < cc.size(); ++l) {
      EXPECT_EQ(gc[l]->type_name(), cc[l]->type_name()) << "layer " << l;
    }
    Model::Chunk a{ids.data(), 18, &cc, want.data(), true};
    Model::Chunk b{ids.data(), 18, &gc, got.data(), true};
    cpu->forward({&a, 1});
    gpu->forward({&b, 1});
    for (int i = 18; i < 24; ++i) {
      Model::Chunk sa{ids.data() + i, 1, &cc, want.data() + size_t(i) * V, true};
      Model::Chunk sb{ids.data() + i, 1, &gc, got.data() + size_t(i) * V, true};
      cpu->forward({&sa, 1});
      gpu->forward({&sb, 1});
    }
    EXPECT_EQ(gc[size_t(global[0])]->nbytes(), cc[size_t(global[0])]->nbytes());
    const double diff = max_abs_diff(got, want);
    std::printf("  gemma4, 288-dim global heads (%s): largest logit difference GPU vs CPU %.3g\n",
                kv.scheme == KVScheme::kDense ? "dense" : "kv 3.5", diff);
    EXPECT_LT(diff, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HybridGolden,
                         ::testing::Values("qwen3_5_text", "gemma4_text", "deepseek_v3",
                                           "gemma4_text_k_eq_v", "qwen3_5_moe_text"));

// ------------------------------------------------------------------------- refusals

TEST_F(HybridKernels, RecurrentStateRefusesTrimSaveAndSharing) {
  DeviceCacheContext context(size_t(64) << 20, nullptr);
  const size_t used = context.pool().stats().used_bytes;
  auto owned = std::make_unique<DeviceRecurrentState>(RecurrentShape{96, 3, 4, 16, 16}, context);
  DeviceRecurrentState& state = *owned;
  EXPECT_GT(context.pool().stats().used_bytes, used);  // the state is a block of the KV pool
  std::vector<float> zero(4 * 16 * 16);
  TURBOKV_CUDA_CHECK(
      cudaMemcpy(zero.data(), state.state(), zero.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(zero, std::vector<float>(zero.size(), 0.0f));
  EXPECT_EQ(state.state_bytes(), (96u * 3 + 4u * 16 * 16) * sizeof(float));
  EXPECT_EQ(state.nbytes(), 0u);
  state.trim(0);
  state.advance(5);
  EXPECT_THROW(state.trim(1), Unsupported);
  ByteWriter w;
  EXPECT_THROW(state.save(w), Unsupported);
  EXPECT_THROW(state.copy_rows(0, 5), Unsupported);
  EXPECT_THROW(DeviceRecurrentState(RecurrentShape{0, 3, 4, 16, 16}, context), InvalidArgument);
  owned.reset();
  EXPECT_EQ(context.pool().stats().used_bytes, used);
}

}  // namespace
}  // namespace turbokv::cuda
