// The TurboQuant recent-token lever (kv_recent_tokens W) on the GPU against the CPU cache of the
// same configuration: each query reads its last W positions as fp16 rows and the older coded
// rows. For W in {1, 2, 5, 64} with and without sink tokens, centering, split and integer bits:
// chunked prefill (chunks shorter and longer than W) and decode steps through the KVCache
// interface and through the formats' batched calls as cuda_decoder.cc queues them; attention
// within the sink tests' tolerance and measurably unlike a W = 0 cache's, codes byte-identical,
// the ring rows equal to the CPU cache's recent rows after every step, records moving between
// the devices; then the model's decode steps (CUDA graphs) against the CPU model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/device_buffer.h"
#include "kv/byte_io.h"
#include "kv/cache_policy.h"
#include "kv/cuda/device_caches.h"
#include "kv/kv_resolve.h"
#include "kv/turboquant_kv_cache.h"
#include "model/cuda/cuda_decoder.h"
#include "model/decoder.h"
#include "test_util.h"

namespace turbokv::cuda {
namespace {

LayerCachePlan tq_plan(int d, double kb, double vb, bool ck, bool cv, int sinks, int recent) {
  LayerCachePlan plan;
  plan.kind = LayerCacheKind::kTurboQuant;
  plan.kv_heads = 2;
  plan.head_dim = d;
  plan.turboquant = TurboQuantKVConfig{kb, vb, 5, true};
  plan.turboquant.center_keys = ck;
  plan.turboquant.center_values = cv;
  plan.turboquant.sink_tokens = sinks;
  plan.turboquant.recent_tokens = recent;
  return plan;
}

std::string plan_name(const LayerCachePlan& p) {
  std::ostringstream s;
  s << "d" << p.head_dim << " K" << p.turboquant.key_bits << "/V" << p.turboquant.value_bits
    << " centering " << (p.turboquant.center_keys ? "k" : "")
    << (p.turboquant.center_values ? "v" : "") << " sinks " << p.turboquant.sink_tokens << " W "
    << p.turboquant.recent_tokens;
  return s.str();
}

std::vector<uint8_t> saved(const KVCache& cache) {
  ByteWriter w;
  cache.save(w);
  return w.buffer();
}

// A TurboQuant cache's recent rows: their first position and fp16 bits [keys, values][kv_heads]
// [rows][head_dim].
struct RecentRows {
  int64_t first_pos = 0;
  int64_t n = 0;
  std::vector<uint16_t> bits;
  bool operator==(const RecentRows& o) const {
    return first_pos == o.first_pos && n == o.n && bits == o.bits;
  }
};

RecentRows recent_rows(const KVCache& cache) {
  const auto& tq = dynamic_cast<const TurboQuantKVCache&>(cache);
  const DenseKVView view = tq.recent_view();
  RecentRows r;
  r.first_pos = view.first_pos;
  r.n = view.n_tokens;
  const int heads = view.kv_heads, d = view.head_dim;
  for (const void* base : {view.k, view.v}) {
    for (int h = 0; h < heads; ++h) {
      const auto* rows = static_cast<const uint16_t*>(base) + size_t(h) * view.head_stride * d;
      r.bits.insert(r.bits.end(), rows, rows + size_t(r.n) * d);
    }
  }
  return r;
}

RecentRows device_recent_rows(const KVCache& gpu) {
  return recent_rows(*dynamic_cast<const DeviceKVCache&>(gpu).to_host());
}

// Keys and values of n tokens with a per-channel offset (what centering removes).
struct Chunk {
  std::vector<float> k, v;
};
Chunk random_chunk(int n, int heads, int d, uint64_t seed) {
  Chunk c;
  c.k = testing::random_normal(size_t(n) * heads * d, seed, 1.5f);
  c.v = testing::random_normal(size_t(n) * heads * d, seed + 1, 2.0f);
  for (size_t i = 0; i < c.k.size(); ++i) {
    c.k[i] += 0.4f * float(i % size_t(d) % 7);
    c.v[i] -= 0.3f * float(i % size_t(d) % 5);
  }
  return c;
}

// Counts the steps at which the lever changes the CPU cache's attention by more than the
// tolerance, and checks the device's output there: far closer to the W cache's than to the
// W = 0 cache's (a device that ignores the window fails).
struct WindowSeen {
  int steps = 0;
  void check(const std::vector<float>& got, const std::vector<float>& want,
             const std::vector<float>& want_w0, int d, const std::string& where) {
    const double err = testing::max_row_relative_error(got, want, d);
    EXPECT_LT(err, 5e-3) << where;
    const double lever = testing::max_row_relative_error(want, want_w0, d);
    if (lever > 2e-2) {
      ++steps;
      EXPECT_LT(err, 0.25 * testing::max_row_relative_error(got, want_w0, d)) << where;
    }
  }
};

class CudaRecent : public testing::CudaTest {};

// The KVCache interface (append, then attention over the chunk just appended, as the model
// attends), for every lever combination; then the record through the host and back.
TEST_F(CudaRecent, CachesAttendAndHoldRowsAsTheCpuCache) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceCacheContext context(size_t(128) << 20, stream);
    struct Config {
      int d;
      double kb, vb;
      bool ck, cv;
    };
    // Integer bits (compile-time kernels), a split codec centered, runtime-generic dims.
    const Config configs[] = {
        {128, 3, 4, false, false}, {64, 3.5, 3, true, true}, {80, 2, 3, false, true}};
    for (const Config& cf : configs) {
      for (int W : {1, 2, 5, 64}) {
        for (int sinks : {0, 3}) {
          const LayerCachePlan plan = tq_plan(cf.d, cf.kb, cf.vb, cf.ck, cf.cv, sinks, W);
          const std::string name = plan_name(plan);
          SCOPED_TRACE(name);
          LayerCachePlan plan0 = plan;
          plan0.turboquant.recent_tokens = 0;
          LayerCaches gpu = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
          LayerCaches cpu = make_layer_caches({plan}, KVDType::kF16);
          LayerCaches cpu0 = make_layer_caches({plan0}, KVDType::kF16);
          const int heads = plan.kv_heads, d = plan.head_dim;
          AttentionParams params;
          params.n_heads = heads * 4;
          params.scale = 1.0f / std::sqrt(float(d));
          uint64_t seed = 11;
          WindowSeen seen;
          auto step = [&](int n, LayerCaches& g) {
            const Chunk c = random_chunk(n, heads, d, seed);
            seed += 2;
            g[0]->append(c.k.data(), c.v.data(), n);
            cpu[0]->append(c.k.data(), c.v.data(), n);
            cpu0[0]->append(c.k.data(), c.v.data(), n);
            const std::vector<float> q =
                testing::random_normal(size_t(n) * params.n_heads * d, seed++, 1.0f);
            std::vector<float> got(q.size()), want(q.size()), want0(q.size());
            g[0]->attend(q.data(), n, params, got.data());
            cpu[0]->attend(q.data(), n, params, want.data());
            cpu0[0]->attend(q.data(), n, params, want0.data());
            const std::string where = str_cat(name, ": chunk of ", n, " at ", g[0]->size());
            seen.check(got, want, want0, d, where);
            EXPECT_TRUE(device_recent_rows(*g[0]) == recent_rows(*cpu[0])) << where;
          };
          // Chunks shorter and longer than W, a first chunk inside the sink tokens.
          for (int n : {2, 1, 70, 1, 1, 300, 5, 1}) step(n, gpu);
          EXPECT_GT(seen.steps, 0) << "the lever never changed the CPU cache's attention";
          ASSERT_EQ(gpu[0]->size(), cpu[0]->size());
          EXPECT_EQ(gpu[0]->nbytes(), cpu[0]->nbytes());
          const std::vector<uint8_t> record = saved(*gpu[0]);
          EXPECT_EQ(record, saved(*cpu[0]));
          // The record on a fresh device cache (from_host: blocks, sinks, ring) continues as the
          // CPU cache does.
          LayerCaches gpu2 = make_device_layer_caches(context, {plan}, DenseElem::kF16, true);
          ByteReader in(record.data(), record.size());
          gpu2[0]->load(in);
          EXPECT_EQ(saved(*gpu2[0]), record);
          EXPECT_TRUE(device_recent_rows(*gpu2[0]) == recent_rows(*cpu[0]));
          for (int n : {4, 1}) step(n, gpu2);
          EXPECT_EQ(saved(*gpu2[0]), saved(*cpu[0]));
          if (W > 1) {  // as the CPU cache: a prefix lacks its last positions' fp16 rows
            EXPECT_THROW(gpu2[0]->trim(1), Unsupported);
            EXPECT_THROW(cpu[0]->trim(1), Unsupported);
          }
        }
      }
    }
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The CUDA model's path: the formats' append, attention and ring-update calls over a batch of
// sequences at different lengths, as cuda_decoder.cc queues them (prefill chunks one sequence
// per call, decode steps of every sequence in one call; QueryRows::k_new / v_new the appended
// rows). Attention, codes and rings as the CPU caches'.
TEST_F(CudaRecent, BatchedCallsMatchTheCpuCaches) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceCacheContext context(size_t(128) << 20, stream);
    const std::vector<LayerCachePlan> plans = {
        tq_plan(128, 3, 4, true, true, 3, 5), tq_plan(64, 3.5, 4, false, false, 0, 64),
        tq_plan(128, 3, 4, false, false, 0, 2), tq_plan(64, 2.5, 3.5, false, true, 3, 1),
        tq_plan(128, 4, 3, false, false, 3, 64)};
    const int n_heads = 8;
    for (const LayerCachePlan& plan : plans) {
      const std::string name = plan_name(plan);
      SCOPED_TRACE(name);
      LayerCachePlan plan0 = plan;
      plan0.turboquant.recent_tokens = 0;
      const int heads = plan.kv_heads, d = plan.head_dim;
      std::vector<LayerCaches> gpu, cpu, cpu0;
      for (int i = 0; i < 3; ++i) {
        gpu.push_back(make_device_layer_caches(context, {plan}, DenseElem::kF16, true));
        cpu.push_back(make_layer_caches({plan}, KVDType::kF16));
        cpu0.push_back(make_layer_caches({plan0}, KVDType::kF16));
      }
      auto device = [&](int i) -> DeviceKVCache& {
        return dynamic_cast<DeviceKVCache&>(*gpu[size_t(i)][0]);
      };
      uint64_t seed = 70;
      WindowSeen seen;
      // One step of sequences `seqs`, n tokens each: calibration, blocks, one append call, one
      // attention call over the new tokens, one ring update.
      auto step = [&](const std::vector<int>& seqs, int n) {
        std::vector<float> k, v;
        std::vector<int> row_seq, row_pos, lens, q_start;
        std::vector<const uint8_t*> table;
        std::vector<TQSequenceState> states;
        std::vector<Chunk> chunks;
        for (size_t j = 0; j < seqs.size(); ++j) {
          chunks.push_back(random_chunk(n, heads, d, seed));
          seed += 2;
          DeviceKVCache& c = device(seqs[j]);
          if (c.needs_calibration()) {
            auto dk = DeviceBuffer<float>::upload(chunks[j].k);
            auto dv = DeviceBuffer<float>::upload(chunks[j].v);
            c.calibrate(dk.data(), dv.data(), n);
          }
          c.reserve_tokens(n);
        }
        size_t stride = 1;
        for (int i : seqs) stride = std::max(stride, device(i).blocks().size());
        for (size_t j = 0; j < seqs.size(); ++j) {
          DeviceKVCache& c = device(seqs[j]);
          for (size_t b = 0; b < stride; ++b) {
            table.push_back(b < c.blocks().size() ? c.blocks()[b] : c.zero_block());
          }
          lens.push_back(int(c.size()) + n);
          states.push_back(c.state());
          q_start.push_back(int(j) * n);
          for (int t = 0; t < n; ++t) {
            row_seq.push_back(int(j));
            row_pos.push_back(int(c.size()) + t);
          }
          k.insert(k.end(), chunks[j].k.begin(), chunks[j].k.end());
          v.insert(v.end(), chunks[j].v.begin(), chunks[j].v.end());
        }
        q_start.push_back(int(seqs.size()) * n);
        const std::vector<float> q =
            testing::random_normal(seqs.size() * n * n_heads * d, seed++, 1.0f);
        auto d_table = DeviceBuffer<const uint8_t*>::upload(table);
        auto d_lens = DeviceBuffer<int>::upload(lens);
        auto d_states = DeviceBuffer<TQSequenceState>::upload(states);
        auto d_seq = DeviceBuffer<int>::upload(row_seq);
        auto d_pos = DeviceBuffer<int>::upload(row_pos);
        auto d_k = DeviceBuffer<float>::upload(k);
        auto d_v = DeviceBuffer<float>::upload(v);
        auto d_qs = DeviceBuffer<int>::upload(q_start);
        auto d_q = DeviceBuffer<float>::upload(q);
        DeviceBuffer<float> d_out(q.size());
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
        const DeviceFormat& f = device(seqs[0]).format();
        f.append(batch, d_states.data(), rows, stream);
        for (size_t j = 0; j < seqs.size(); ++j) device(seqs[j]).advance(n);
        QueryRows qr;
        qr.q = d_q.data();
        qr.out = d_out.data();
        qr.q_start = d_qs.data();
        qr.max_n_q = n;
        qr.k_new = d_k.data();
        qr.v_new = d_v.data();
        AttentionOptions o;
        o.n_heads = n_heads;
        o.scale = 1.0f / std::sqrt(float(d));
        const size_t ws_bytes = f.workspace_bytes(batch, qr, o);
        DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
        f.attend(batch, d_states.data(), qr, o, n, ws.data(), ws_bytes, stream);
        f.update_recent(batch, d_states.data(), qr, stream);
        TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
        const std::vector<float> got = d_out.download();
        AttentionParams params;
        params.n_heads = n_heads;
        params.scale = o.scale;
        const size_t per_seq = size_t(n) * n_heads * d;
        for (size_t j = 0; j < seqs.size(); ++j) {
          const size_t i = size_t(seqs[j]);
          cpu[i][0]->append(chunks[j].k.data(), chunks[j].v.data(), n);
          cpu0[i][0]->append(chunks[j].k.data(), chunks[j].v.data(), n);
          std::vector<float> want(per_seq), want0(per_seq),
              mine(got.begin() + j * per_seq, got.begin() + (j + 1) * per_seq);
          cpu[i][0]->attend(q.data() + j * per_seq, n, params, want.data());
          cpu0[i][0]->attend(q.data() + j * per_seq, n, params, want0.data());
          const std::string where =
              str_cat(name, ": sequence ", i, " at ", device(int(i)).size(), " n_q ", n);
          seen.check(mine, want, want0, d, where);
          EXPECT_TRUE(device_recent_rows(*gpu[i][0]) == recent_rows(*cpu[i][0])) << where;
        }
      };
      step({0}, 3);  // shorter than 3 sink tokens + 1
      step({1}, 40);
      step({1}, 30);
      step({2}, 100);
      step({2}, 200);
      for (int s = 0; s < 12; ++s) step({0, 1, 2}, 1);
      step({1}, 7);
      for (int s = 0; s < 4; ++s) step({0, 1, 2}, 1);
      EXPECT_GT(seen.steps, 0) << "the lever never changed the CPU caches' attention";
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(saved(*gpu[size_t(i)][0]), saved(*cpu[size_t(i)][0])) << "sequence " << i;
        EXPECT_EQ(gpu[size_t(i)][0]->nbytes(), cpu[size_t(i)][0]->nbytes()) << "sequence " << i;
      }
    }
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The ring is part of the state block admission counts: 2 * kv_heads * (W - 1) * head_dim fp16
// (16-B aligned sections) on top of the sink rows; W <= 1 holds none.
TEST_F(CudaRecent, StateBlockHoldsTheRing) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceCacheContext context(size_t(16) << 20, stream);
    auto bytes = [&](int sinks, int recent) {
      return DeviceKVCache::state_block_bytes(
          *context.format(tq_plan(128, 3, 4, false, false, sinks, recent), DenseElem::kF16, true));
    };
    EXPECT_EQ(bytes(0, 0), 0u);
    EXPECT_EQ(bytes(0, 1), 0u);
    EXPECT_EQ(bytes(0, 64), size_t(2) * 2 * 63 * 128 * 2);
    EXPECT_EQ(bytes(4, 5), bytes(4, 0) + size_t(2) * 2 * 4 * 128 * 2);
    // The fused kernels take no recent tokens: W > 0 is a generic format.
    EXPECT_NE(context.format(tq_plan(128, 3, 4, false, false, 0, 1), DenseElem::kF16, true),
              context.format(tq_plan(128, 3, 4, false, false, 0, 0), DenseElem::kF16, true));
  }
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The model's decode steps (CUDA graphs for single-token steps, two sequences batched) with
// sink and recent tokens: logits nearer the CPU model's with the same setting than its W = 0
// ones, and every layer's ring rows near the CPU caches' recent rows of the same positions
// (the keys come from different GEMMs: close, not bitwise).
TEST_F(CudaRecent, ModelStepsMatchTheCpuModel) {
  const std::string dir = std::string(TURBOKV_SOURCE_DIR) + "/models/tinycode-llama";
  std::unique_ptr<Model> cpu = Model::load(dir);
  std::unique_ptr<Model> host = Model::load(dir);
  CudaModelOptions options;
  options.kv_cache_bytes = size_t(256) << 20;
  const CudaDecoderModel gpu(
      std::unique_ptr<DecoderModel>(dynamic_cast<DecoderModel*>(host.release())), options);
  KVOptions levers;
  levers.kv_bits = 3.5;
  levers.kv_sink_tokens = 4;
  ResolvedKV kv = resolve_kv_options(levers);
  ResolvedKV kv0 = kv;
  kv.recent_tokens = 16;
  const int V = gpu.info().vocab_size;
  std::vector<int32_t> prompt[2];
  for (int t = 0; t < 90; ++t) prompt[0].push_back(int32_t((t * 131 + 7) % 8000));
  for (int t = 0; t < 37; ++t) prompt[1].push_back(int32_t((t * 71 + 3) % 8000));
  // Logits of every step: prompts in chunks (40 + 50, 37), then 10 decode steps of both.
  auto run = [&](const Model& m, const ResolvedKV& setting, std::vector<LayerCaches>* keep) {
    std::vector<LayerCaches> caches(2);
    for (LayerCaches& c : caches) {
      c = &m == static_cast<const Model*>(&gpu) ? gpu.make_caches(setting)
                                                : make_layer_caches(m.layer_specs(), setting);
    }
    std::vector<std::vector<float>> out;
    std::vector<float> logits[2] = {std::vector<float>(size_t(V)), std::vector<float>(size_t(V))};
    auto forward = [&](std::vector<std::pair<int, std::pair<const int32_t*, int>>> parts) {
      std::vector<Model::Chunk> chunks;
      for (auto& [i, span] : parts) {
        chunks.push_back(
            Model::Chunk{span.first, span.second, &caches[size_t(i)], logits[i].data(), false});
      }
      m.forward(chunks);
      for (auto& [i, span] : parts) out.push_back(logits[i]);
    };
    forward({{0, {prompt[0].data(), 40}}, {1, {prompt[1].data(), 37}}});
    forward({{0, {prompt[0].data() + 40, 50}}});
    std::vector<int32_t> next[2];
    for (int step = 0; step < 10; ++step) {
      for (int i = 0; i < 2; ++i) next[i].push_back(int32_t((step * 997 + i * 13 + 5) % 8000));
      forward({{0, {&next[0].back(), 1}}, {1, {&next[1].back(), 1}}});
    }
    if (keep != nullptr) *keep = std::move(caches);
    return out;
  };
  std::vector<LayerCaches> gpu_caches, cpu_caches;
  const auto got = run(gpu, kv, &gpu_caches);
  const auto want = run(*cpu, kv, &cpu_caches);
  const auto want0 = run(*cpu, kv0, nullptr);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), want0.size());
  // Mean absolute logit differences over every step: the GPU's logits nearer the CPU model's
  // with the same W than to its W = 0 ones (the devices' GEMMs differ, so not bitwise).
  double err = 0, err0 = 0;
  size_t count = 0;
  for (size_t s = 0; s < got.size(); ++s) {
    for (size_t i = 0; i < got[s].size(); ++i) {
      err += std::abs(double(got[s][i]) - want[s][i]);
      err0 += std::abs(double(got[s][i]) - want0[s][i]);
      ++count;
    }
  }
  err /= double(count);
  err0 /= double(count);
  std::printf("  mean |logit| difference: GPU vs CPU W=16 %.4g, vs CPU W=0 %.4g\n", err, err0);
  EXPECT_LT(err, err0);
  for (int i = 0; i < 2; ++i) {
    for (size_t l = 0; l < gpu_caches[size_t(i)].size(); ++l) {
      const auto* device = dynamic_cast<const DeviceKVCache*>(gpu_caches[size_t(i)][l].get());
      if (device == nullptr || device->format().recent_tokens() == 0) continue;
      const RecentRows g = device_recent_rows(*device);
      const RecentRows c = recent_rows(*cpu_caches[size_t(i)][l]);
      ASSERT_EQ(g.first_pos, c.first_pos) << "sequence " << i << " layer " << l;
      ASSERT_EQ(g.n, 15) << "sequence " << i << " layer " << l;
      ASSERT_EQ(g.bits.size(), c.bits.size());
      double diff = 0, norm = 0;
      for (size_t e = 0; e < g.bits.size(); ++e) {
        const double a = f16_to_f32(g.bits[e]), b = f16_to_f32(c.bits[e]);
        diff += (a - b) * (a - b);
        norm += b * b;
      }
      EXPECT_LT(std::sqrt(diff / std::max(norm, 1e-30)), 5e-2)
          << "sequence " << i << " layer " << l;
    }
  }
}

}  // namespace
}  // namespace turbokv::cuda
