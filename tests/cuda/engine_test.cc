// The CUDA engine against references we did not write and against the CPU engine:
//  - every fixture family's logits and greedy tokens against transformers (dense caches);
//  - device KV caches byte-identical to the CPU caches for the same keys and values (their
//    saved records compared byte for byte), every TurboQuant / uniform / dense setting and the
//    levers (centering, sink tokens, uniform with the Hadamard rotation), one sequence and
//    batches of sequences, and attention on them against the CPU caches' attention; cache files
//    moving between the devices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "kernels/cuda/device_buffer.h"
#include "kv/byte_io.h"
#include "kv/cache_policy.h"
#include "kv/cuda/device_caches.h"
#include "kv/kv_resolve.h"
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

// ---------------------------------------------------------------------------- batch invariance

// A sequence for batch_invariant_run: its prompt, KV setting and the step it joins at.
struct InvariantSeq {
  std::vector<int32_t> prompt;
  ResolvedKV kv;
  int start = 0;
};

// Runs the sequences as the engine's scheduler batches them: each step, every sequence past its
// prompt decodes one greedy token, then prompts advance by chunks of 256 aligned to the
// sequence's start, within 512 tokens per forward (a chunk waits rather than being cut).
// Returns each sequence's logits at each of its steps (prompt chunks, then `decode` tokens).
std::vector<std::vector<std::vector<float>>> batch_invariant_run(
    const CudaDecoderModel& gpu, const std::vector<InvariantSeq>& seqs, int decode) {
  const int V = gpu.info().vocab_size;
  struct State {
    LayerCaches caches;
    std::vector<int32_t> tokens;
    size_t done = 0;  // tokens through the model
    int generated = 0;
    std::vector<float> logits;
  };
  std::vector<State> st(seqs.size());
  std::vector<std::vector<std::vector<float>>> out(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    st[i].caches = gpu.make_caches(seqs[i].kv);
    st[i].tokens = seqs[i].prompt;
    st[i].logits.resize(size_t(V));
  }
  for (int step = 0;; ++step) {
    std::vector<Model::Chunk> chunks;
    std::vector<size_t> who;
    int budget = 512;
    for (int pass = 0; pass < 2; ++pass) {  // decode tokens first, then prompt chunks
      for (size_t i = 0; i < seqs.size(); ++i) {
        State& s = st[i];
        const size_t prompt = seqs[i].prompt.size();
        if (step < seqs[i].start || s.generated >= decode) continue;
        const bool decoding = s.done >= prompt;
        if (decoding != (pass == 0)) continue;
        const int n = decoding ? 1 : int(std::min(prompt - s.done, 256 - s.done % 256));
        if (n > budget) continue;
        budget -= n;
        Model::Chunk c;
        c.tokens = s.tokens.data() + s.done;
        c.n_tokens = n;
        c.caches = &s.caches;
        c.logits = s.logits.data();
        chunks.push_back(c);
        who.push_back(i);
      }
    }
    if (chunks.empty()) {
      bool pending = false;
      for (size_t i = 0; i < seqs.size(); ++i) pending |= st[i].generated < decode;
      if (!pending) break;
      continue;
    }
    gpu.forward(chunks);
    for (size_t j = 0; j < chunks.size(); ++j) {
      State& s = st[who[j]];
      s.done += size_t(chunks[j].n_tokens);
      out[who[j]].push_back(s.logits);
      if (s.done >= seqs[who[j]].prompt.size()) {
        s.tokens.push_back(
            int32_t(std::max_element(s.logits.begin(), s.logits.end()) - s.logits.begin()));
        ++s.generated;
      }
    }
  }
  return out;
}

// With batch_invariant, every sequence's logits are the same bits alone and batched with
// others: prompts and decode tokens in the same forwards, more than 8 decode rows, dense,
// TurboQuant (fused kernels, a sequence longer than one decode split) and uniform (paged
// kernels) caches in one step, sequences joining while others decode.
TEST_F(CudaEngine, BatchInvariantLogitsDoNotDependOnTheBatch) {
  std::unique_ptr<Model> model =
      Model::load(std::string(TURBOKV_SOURCE_DIR) + "/models/tinycode-llama");
  CudaModelOptions options;
  options.kv_cache_bytes = size_t(1) << 30;
  options.batch_invariant = true;
  const CudaDecoderModel gpu(
      std::unique_ptr<DecoderModel>(dynamic_cast<DecoderModel*>(model.release())), options);
  KVOptions tq;
  tq.kv_bits = 3.5;
  KVOptions uniform;
  uniform.kv_bits = 4;
  const ResolvedKV kinds[3] = {ResolvedKV{}, resolve_kv_options(tq), resolve_kv_options(uniform)};
  const int lens[] = {300, 5, 1300, 40, 700, 257, 1, 90, 520, 33, 1100, 12, 64, 180};
  std::vector<InvariantSeq> seqs;
  for (size_t i = 0; i < std::size(lens); ++i) {
    InvariantSeq q;
    for (int t = 0; t < lens[i]; ++t) q.prompt.push_back(int32_t((t * 131 + i * 977 + 7) % 8000));
    q.kv = kinds[i % 3];
    q.start = int(i % 4);
    seqs.push_back(std::move(q));
  }
  constexpr int kDecode = 24;
  const auto batched = batch_invariant_run(gpu, seqs, kDecode);
  for (size_t i = 0; i < seqs.size(); ++i) {
    InvariantSeq solo = seqs[i];
    solo.start = 0;
    const auto alone = batch_invariant_run(gpu, {solo}, kDecode)[0];
    ASSERT_EQ(alone.size(), batched[i].size()) << "sequence " << i;
    for (size_t t = 0; t < alone.size(); ++t) {
      ASSERT_EQ(std::memcmp(alone[t].data(), batched[i][t].data(), alone[t].size() * 4), 0)
          << "sequence " << i << " (" << lens[i] << " prompt tokens), step " << t;
    }
  }
  // Not covered: refused by name.
  EXPECT_THROW(
      {
        std::unique_ptr<Model> moe = Model::load(fixture("hf-tiny/qwen3_moe"));
        CudaDecoderModel bad(
            std::unique_ptr<DecoderModel>(dynamic_cast<DecoderModel*>(moe.release())), options);
      },
      Unsupported);
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
    for (auto [kb, vb] : std::vector<std::pair<double, double>>{{1, 1},
                                                                {2, 2},
                                                                {2, 3},
                                                                {3, 3},
                                                                {3, 4},
                                                                {4, 4},
                                                                {4, 2},
                                                                {5, 6},
                                                                {8, 8},
                                                                {7, 7},
                                                                {2.5, 2.5},
                                                                {1.5, 2.5},
                                                                {3, 3.5},
                                                                {3.5, 3.5},
                                                                {3.5, 4},
                                                                {4, 3},
                                                                {3, 2}}) {
      tq(d, kb, vb, true);
    }
  }
  tq(128, 3, 4, false);
  tq(80, 3.5, 3.5, false);
  // The levers: centering (keys, values, both) and sink tokens (1, 4; 68 and 80 reach past the
  // first chunk of 70 tokens, 1000 past the whole sequence), alone and together: d128 K3/V4 and
  // K4/V3 (the fused kernels when centered, the generic compile-time ones with sinks), a split
  // codec and runtime-generic settings.
  auto lever = [&](int d, double kb, double vb, bool ck, bool cv, int sinks) {
    KVCase c;
    c.plan.kind = LayerCacheKind::kTurboQuant;
    c.plan.kv_heads = 2;
    c.plan.head_dim = d;
    c.plan.turboquant = TurboQuantKVConfig{kb, vb, 7, true};
    c.plan.turboquant.center_keys = ck;
    c.plan.turboquant.center_values = cv;
    c.plan.turboquant.sink_tokens = sinks;
    std::ostringstream s;
    s << "turboquant d" << d << " K" << kb << "/V" << vb << " centering " << (ck ? "k" : "")
      << (cv ? "v" : "") << " sinks " << sinks;
    c.name = s.str();
    cases.push_back(c);
  };
  for (auto [d, kb, vb] : std::vector<std::tuple<int, double, double>>{
           {128, 3, 4}, {128, 4, 3}, {64, 2.5, 3.5}, {80, 3, 3}, {256, 4, 4}}) {
    for (auto [ck, cv] : std::vector<std::pair<bool, bool>>{
             {true, false}, {false, true}, {true, true}, {false, false}}) {
      for (int sinks : {0, 1, 4}) {
        if (ck || cv || sinks > 0) lever(d, kb, vb, ck, cv, sinks);
      }
    }
  }
  for (int sinks : {68, 80, 1000}) {
    lever(128, 3, 4, true, true, sinks);
    lever(64, 3.5, 3, true, false, sinks);
  }
  // The unbiased norm (n / <y, c>): the fused d128 kernels, the generic ones, a split codec.
  for (auto [d, kb, vb, centered] : std::vector<std::tuple<int, double, double, bool>>{
           {128, 3, 4, false}, {128, 4, 3, true}, {64, 2.5, 3.5, true}, {80, 3, 3, false}}) {
    lever(d, kb, vb, centered, centered, centered ? 1 : 0);
    cases.back().plan.turboquant.unbiased_norm = true;
    cases.back().name += " unbiased";
  }
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
  // Uniform with the rotation: Hadamard for power-of-two dims, the dense rotation for d80.
  for (int d : {64, 80, 128, 256}) {
    for (auto [kb, vb, g] : std::vector<std::tuple<int, int, int>>{
             {2, 2, 32}, {3, 3, 64}, {4, 4, 64}, {4, 2, 128}, {8, 8, 32}}) {
      KVCase c;
      c.plan.kind = LayerCacheKind::kUniform;
      c.plan.kv_heads = 2;
      c.plan.head_dim = d;
      c.plan.uniform = UniformKVConfig{kb, vb, g, true, 11};
      c.name = "uniform+hadamard d" + std::to_string(d) + " K" + std::to_string(kb) + "/V" +
               std::to_string(vb) + " g" + std::to_string(g);
      cases.push_back(c);
    }
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
      const KVDType cpu_dtype = c.elem == DenseElem::kF32    ? KVDType::kF32
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
      // Keys and values with a common offset per channel (what centering removes).
      std::vector<float> offset = testing::random_normal(size_t(heads) * d, 99, 2.0f);
      auto attend_alike = [&](int n_q, const char* when) {
        AttentionParams params;
        params.n_heads = heads * 4;
        params.scale = 1.0f / std::sqrt(float(d));
        const std::vector<float> q =
            testing::random_normal(size_t(n_q) * params.n_heads * d, seed++, 1.0f);
        std::vector<float> want_out(q.size()), got_out(q.size());
        cpu[0]->attend(q.data(), n_q, params, want_out.data());
        gpu[0]->attend(q.data(), n_q, params, got_out.data());
        const double err = testing::max_row_relative_error(got_out, want_out, d);
        EXPECT_LT(err, 5e-3) << c.name << " n_q " << n_q << " " << when;
      };
      for (int n : {70, 1, 1, 300, 1}) {
        std::vector<float> k = testing::random_normal(size_t(n) * heads * d, seed++, 1.5f);
        std::vector<float> v = testing::random_normal(size_t(n) * heads * d, seed++, 3.0f);
        for (size_t i = 0; i < k.size(); ++i) {
          k[i] += offset[i % offset.size()];
          v[i] -= offset[i % offset.size()];
        }
        cpu[0]->append(k.data(), v.data(), n);
        gpu[0]->append(k.data(), v.data(), n);
        // Prefill over the whole chunk (every query of it, causal), as the model attends.
        if (n > 1) attend_alike(n, "over the chunk just appended");
      }
      ASSERT_EQ(gpu[0]->size(), cpu[0]->size());
      EXPECT_EQ(gpu[0]->nbytes(), cpu[0]->nbytes());
      EXPECT_EQ(gpu[0]->calibration_tokens(), cpu[0]->calibration_tokens());
      const std::vector<uint8_t> want = saved(*cpu[0]), got = saved(*gpu[0]);
      if (want != got) {
        size_t i = 0;
        while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
        ADD_FAILURE() << c.name << ": saved records differ at byte " << i << " of " << want.size()
                      << " (device record " << got.size() << " bytes)";
        if (++failures > 10) break;
      }
      for (int n_q : {1, 5}) attend_alike(n_q, "at the end");
    }
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The CUDA model's path for the levers: the formats' append and attention calls over a batch
// of sequences at different lengths (each sequence's own blocks, means and sink rows through
// its TQSequenceState), as cuda_decoder.cc queues them: prefill chunks one sequence per call,
// then decode steps of every sequence in one append and one attention call. Saved records
// equal the CPU caches', attention agrees with theirs.
TEST_F(CudaKV, BatchedLeverCachesMatchTheCpuCaches) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceCacheContext context(size_t(128) << 20, stream);
    std::vector<std::pair<std::string, LayerCachePlan>> plans;
    auto tq = [&](const std::string& name, int d, double kb, double vb, bool ck, bool cv,
                  int sinks) {
      LayerCachePlan plan;
      plan.kind = LayerCacheKind::kTurboQuant;
      plan.kv_heads = 2;
      plan.head_dim = d;
      plan.turboquant = TurboQuantKVConfig{kb, vb, 3, true};
      plan.turboquant.center_keys = ck;
      plan.turboquant.center_values = cv;
      plan.turboquant.sink_tokens = sinks;
      plans.emplace_back(name, plan);
    };
    tq("K3/V4 d128 centered, 4 sinks", 128, 3, 4, true, true, 4);
    tq("K3/V4 d128 keys centered (fused)", 128, 3, 4, true, false, 0);
    tq("K4/V3 d128 centered (fused)", 128, 4, 3, true, true, 0);
    tq("K3/V4 d128 16 sinks", 128, 3, 4, false, false, 16);
    tq("K2.5/V3.5 d64 values centered, 1 sink", 64, 2.5, 3.5, false, true, 1);
    {
      LayerCachePlan plan;
      plan.kind = LayerCacheKind::kUniform;
      plan.kv_heads = 2;
      plan.head_dim = 128;
      plan.uniform = UniformKVConfig{4, 4, 64, true, 9};
      plans.emplace_back("uniform+hadamard d128", plan);
    }
    const int n_heads = 8;
    for (const auto& [name, plan] : plans) {
      SCOPED_TRACE(name);
      const int heads = plan.kv_heads, d = plan.head_dim;
      const size_t row = size_t(heads) * d;
      const int prompts[3] = {3, 40, 300};  // the first is shorter than 4 and 16 sink tokens
      std::vector<LayerCaches> gpu, cpu;
      for (int i = 0; i < 3; ++i) {
        gpu.push_back(make_device_layer_caches(context, {plan}, DenseElem::kF16, true));
        cpu.push_back(make_layer_caches({plan}, KVDType::kF16));
      }
      auto device = [&](int i) -> DeviceKVCache& {
        return dynamic_cast<DeviceKVCache&>(*gpu[size_t(i)][0]);
      };
      uint64_t seed = 40;
      // One append call for sequences `seqs`, n tokens each; returns nothing, checks nothing.
      auto append = [&](const std::vector<int>& seqs, const std::vector<int>& n) {
        std::vector<float> k, v;
        std::vector<int> row_seq, row_pos, lens;
        std::vector<std::vector<float>> ks, vs;
        for (size_t j = 0; j < seqs.size(); ++j) {
          ks.push_back(testing::random_normal(size_t(n[j]) * row, seed++, 1.5f));
          vs.push_back(testing::random_normal(size_t(n[j]) * row, seed++, 2.0f));
          for (size_t e = 0; e < ks.back().size(); ++e) ks.back()[e] += 0.5f * float(e % 7);
          cpu[size_t(seqs[j])][0]->append(ks.back().data(), vs.back().data(), n[j]);
        }
        // Calibration first (from the chunk's device rows), then blocks, then one append.
        for (size_t j = 0; j < seqs.size(); ++j) {
          DeviceKVCache& c = device(seqs[j]);
          if (c.needs_calibration()) {
            auto dk = DeviceBuffer<float>::upload(ks[j]);
            auto dv = DeviceBuffer<float>::upload(vs[j]);
            c.calibrate(dk.data(), dv.data(), n[j]);
          }
          c.reserve_tokens(n[j]);
        }
        size_t stride = 1;
        for (int i : seqs) stride = std::max(stride, device(i).blocks().size());
        std::vector<const uint8_t*> table;
        std::vector<TQSequenceState> states;
        for (size_t j = 0; j < seqs.size(); ++j) {
          DeviceKVCache& c = device(seqs[j]);
          for (size_t b = 0; b < stride; ++b) {
            table.push_back(b < c.blocks().size() ? c.blocks()[b] : c.zero_block());
          }
          lens.push_back(int(c.size()) + n[j]);
          states.push_back(c.state());
          for (int t = 0; t < n[j]; ++t) {
            row_seq.push_back(int(j));
            row_pos.push_back(int(c.size()) + t);
          }
          k.insert(k.end(), ks[j].begin(), ks[j].end());
          v.insert(v.end(), vs[j].begin(), vs[j].end());
        }
        auto d_table = DeviceBuffer<const uint8_t*>::upload(table);
        auto d_lens = DeviceBuffer<int>::upload(lens);
        auto d_states = DeviceBuffer<TQSequenceState>::upload(states);
        auto d_seq = DeviceBuffer<int>::upload(row_seq);
        auto d_pos = DeviceBuffer<int>::upload(row_pos);
        auto d_k = DeviceBuffer<float>::upload(k);
        auto d_v = DeviceBuffer<float>::upload(v);
        PagedBatch batch;
        batch.block_table = d_table.data();
        batch.table_stride = int(stride);
        batch.seq_len = d_lens.data();
        batch.batch = int(seqs.size());
        batch.max_len = *std::max_element(lens.begin(), lens.end());
        AppendRows rows;
        rows.k = d_k.data();
        rows.v = d_v.data();
        rows.row_seq = d_seq.data();
        rows.row_pos = d_pos.data();
        rows.rows = int(row_seq.size());
        device(seqs[0]).format().append(batch, d_states.data(), rows, stream);
        TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
        for (size_t j = 0; j < seqs.size(); ++j) device(seqs[j]).advance(n[j]);
      };
      // One attention call for sequences `seqs`, n_q queries each (their last positions).
      auto attend = [&](const std::vector<int>& seqs, int n_q) {
        size_t stride = 1;
        for (int i : seqs) stride = std::max(stride, device(i).blocks().size());
        std::vector<const uint8_t*> table;
        std::vector<TQSequenceState> states;
        std::vector<int> lens, q_start;
        for (size_t j = 0; j < seqs.size(); ++j) {
          DeviceKVCache& c = device(seqs[j]);
          for (size_t b = 0; b < stride; ++b) {
            table.push_back(b < c.blocks().size() ? c.blocks()[b] : c.zero_block());
          }
          lens.push_back(int(c.size()));
          states.push_back(c.state());
          q_start.push_back(int(j) * n_q);
        }
        q_start.push_back(int(seqs.size()) * n_q);
        const std::vector<float> q =
            testing::random_normal(seqs.size() * n_q * n_heads * d, seed++, 1.0f);
        auto d_table = DeviceBuffer<const uint8_t*>::upload(table);
        auto d_lens = DeviceBuffer<int>::upload(lens);
        auto d_states = DeviceBuffer<TQSequenceState>::upload(states);
        auto d_qs = DeviceBuffer<int>::upload(q_start);
        auto d_q = DeviceBuffer<float>::upload(q);
        DeviceBuffer<float> d_out(q.size());
        PagedBatch batch;
        batch.block_table = d_table.data();
        batch.table_stride = int(stride);
        batch.seq_len = d_lens.data();
        batch.batch = int(seqs.size());
        batch.max_len = *std::max_element(lens.begin(), lens.end());
        QueryRows qr;
        qr.q = d_q.data();
        qr.out = d_out.data();
        qr.q_start = d_qs.data();
        qr.max_n_q = n_q;
        AttentionOptions o;
        o.n_heads = n_heads;
        o.scale = 1.0f / std::sqrt(float(d));
        const DeviceFormat& f = device(seqs[0]).format();
        const size_t ws_bytes = f.workspace_bytes(batch, qr, o);
        DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
        if (f.zeroed_workspace()) {
          TURBOKV_CUDA_CHECK(cudaMemsetAsync(ws.data(), 0, ws_bytes, stream));
        }
        f.attend(batch, d_states.data(), qr, o, n_q, ws.data(), ws_bytes, stream);
        TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
        const std::vector<float> got = d_out.download();
        AttentionParams params;
        params.n_heads = n_heads;
        params.scale = o.scale;
        const size_t per_seq = size_t(n_q) * n_heads * d;
        for (size_t j = 0; j < seqs.size(); ++j) {
          std::vector<float> want(per_seq),
              mine(got.begin() + j * per_seq, got.begin() + (j + 1) * per_seq);
          cpu[size_t(seqs[j])][0]->attend(q.data() + j * per_seq, n_q, params, want.data());
          EXPECT_LT(testing::max_row_relative_error(mine, want, d), 5e-3)
              << "sequence " << seqs[j] << " at " << device(seqs[j]).size() << " n_q " << n_q;
        }
      };
      for (int i = 0; i < 3; ++i) {
        append({i}, {prompts[i]});
        attend({i}, prompts[i]);  // the prompt's causal prefill
      }
      for (int step = 0; step < 20; ++step) {
        append({0, 1, 2}, {1, 1, 1});
        attend({0, 1, 2}, 1);
      }
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(saved(*gpu[size_t(i)][0]), saved(*cpu[size_t(i)][0])) << "sequence " << i;
        EXPECT_EQ(gpu[size_t(i)][0]->nbytes(), cpu[size_t(i)][0]->nbytes()) << "sequence " << i;
      }
    }
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// A cache saved from the GPU loads into a CPU cache (and back) and continues identically; a
// cache saved on the CPU loads on the GPU and continues identically. Split codecs, centering
// (its means), sink tokens (fewer held than the setting, and all of them) and the uniform
// rotation travel in the file.
TEST_F(CudaKV, SavedCachesMoveBetweenDevices) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceCacheContext context(size_t(64) << 20, stream);
    std::vector<std::pair<std::string, LayerCachePlan>> plans;
    auto tq = [&](const std::string& name, double kb, double vb, bool ck, bool cv, int sinks) {
      LayerCachePlan plan;
      plan.kind = LayerCacheKind::kTurboQuant;
      plan.kv_heads = 2;
      plan.head_dim = 128;
      plan.turboquant = TurboQuantKVConfig{kb, vb, 0, true};
      plan.turboquant.center_keys = ck;
      plan.turboquant.center_values = cv;
      plan.turboquant.sink_tokens = sinks;
      plans.emplace_back(name, plan);
    };
    tq("K3.5/V3.5", 3.5, 3.5, false, false, 0);
    tq("K3/V4 centered, 4 sinks", 3, 4, true, true, 4);
    tq("K3.5/V4 values centered, 50 sinks", 3.5, 4, false, true, 50);
    tq("K4/V3 centered (fused kernels)", 4, 3, true, true, 0);
    {
      LayerCachePlan plan;
      plan.kind = LayerCacheKind::kUniform;
      plan.kv_heads = 2;
      plan.head_dim = 128;
      plan.uniform = UniformKVConfig{4, 4, 64, true, 5};
      plans.emplace_back("uniform+hadamard", plan);
    }
    for (const auto& [name, plan] : plans) {
      SCOPED_TRACE(name);
      for (int n : {40, 300}) {
        SCOPED_TRACE(n);
        LayerCaches gpu = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
        LayerCaches cpu0 = make_layer_caches({plan}, KVDType::kF16);
        const std::vector<float> k = testing::random_normal(size_t(n) * 2 * 128, 3);
        const std::vector<float> v = testing::random_normal(size_t(n) * 2 * 128, 4);
        gpu[0]->append(k.data(), v.data(), n);
        cpu0[0]->append(k.data(), v.data(), n);
        ByteWriter w;
        gpu[0]->save(w);
        EXPECT_EQ(w.buffer(), saved(*cpu0[0]));
        LayerCaches cpu = make_layer_caches({plan}, KVDType::kF16);
        ByteReader r(w.buffer().data(), w.buffer().size());
        cpu[0]->load(r);
        LayerCaches gpu2 = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
        ByteReader r2(w.buffer().data(), w.buffer().size());
        gpu2[0]->load(r2);
        const std::vector<float> more = testing::random_normal(size_t(3) * 2 * 128, 5);
        cpu[0]->append(more.data(), more.data(), 3);
        gpu2[0]->append(more.data(), more.data(), 3);
        EXPECT_EQ(saved(*cpu[0]), saved(*gpu2[0]));
        // CPU -> GPU: the CPU cache's file on the device continues as the CPU cache does.
        LayerCaches gpu3 = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
        const std::vector<uint8_t> from_cpu = saved(*cpu0[0]);
        ByteReader r3(from_cpu.data(), from_cpu.size());
        gpu3[0]->load(r3);
        EXPECT_EQ(gpu3[0]->nbytes(), cpu0[0]->nbytes());
        cpu0[0]->append(more.data(), more.data(), 3);
        gpu3[0]->append(more.data(), more.data(), 3);
        EXPECT_EQ(saved(*cpu0[0]), saved(*gpu3[0]));
        AttentionParams params;
        params.n_heads = 8;
        params.scale = 1.0f / std::sqrt(128.0f);
        const std::vector<float> q = testing::random_normal(size_t(2) * 8 * 128, 6);
        std::vector<float> want(q.size()), got(q.size());
        cpu0[0]->attend(q.data(), 2, params, want.data());
        gpu3[0]->attend(q.data(), 2, params, got.data());
        EXPECT_LT(testing::max_row_relative_error(got, want, 128), 5e-3);
      }
    }
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
    // bits 0: dense; -1: K3/V4 with centering and 4 sink tokens (rows that hold the sink
    // tokens are copied, not shared: the sinks live outside the blocks).
    for (double bits : {3.5, 4.0, 0.0, -1.0}) {
      LayerCachePlan plan;
      plan.kv_heads = 2;
      plan.head_dim = 128;
      plan.kind = bits == 0 ? LayerCacheKind::kDense : LayerCacheKind::kTurboQuant;
      plan.turboquant = TurboQuantKVConfig{bits <= 0 ? 3 : bits, bits <= 0 ? 4 : bits, 0, true};
      const bool levers = bits < 0;
      if (levers) {
        plan.turboquant.center_keys = plan.turboquant.center_values = true;
        plan.turboquant.sink_tokens = 4;
      }
      SCOPED_TRACE(bits);
      LayerCaches a = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
      LayerCaches cpu = make_layer_caches({plan}, KVDType::kF16);
      const std::vector<float> k = testing::random_normal(size_t(600) * 2 * 128, 5);
      const std::vector<float> v = testing::random_normal(size_t(600) * 2 * 128, 6);
      a[0]->append(k.data(), v.data(), 600);
      cpu[0]->append(k.data(), v.data(), 600);
      const int64_t blocks_before = context.pool().stats().blocks_in_use;
      std::shared_ptr<const KVRows> rows = a[0]->copy_rows(0, 512);
      if (levers) {
        EXPECT_EQ(dynamic_cast<const DeviceKVRows*>(rows.get()), nullptr);
        // The second block alone is shared.
        std::shared_ptr<const KVRows> second = a[0]->copy_rows(256, 256);
        EXPECT_NE(dynamic_cast<const DeviceKVRows*>(second.get()), nullptr);
      } else {
        ASSERT_NE(dynamic_cast<const DeviceKVRows*>(rows.get()), nullptr);
        EXPECT_EQ(context.pool().stats().blocks_in_use, blocks_before);  // nothing copied
      }
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
