// GPU benchmarks (gpu_bench.h).
#include "eval/gpu_bench.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/model_ops.h"
#include "kv/cuda/device_caches.h"

namespace turbokv::eval {
namespace {

using Clock = std::chrono::steady_clock;

// The benchmark fills paged device caches; layers kept elsewhere (recurrent states, KV-shared
// views, wide dense caches of the hybrid families) are refused by name.
cuda::DeviceKVCache& device_cache(LayerCaches& caches, size_t layer) {
  auto* cache = dynamic_cast<cuda::DeviceKVCache*>(caches[layer].get());
  if (cache == nullptr) {
    throw Unsupported(str_cat("bench e2e --device cuda: layer ", layer,
                              " does not keep a paged KV cache (recurrent state, shared or wide "
                              "layer); the GPU benchmark runs models whose every layer has one"));
  }
  return *cache;
}

// Fills every layer's cache to `depth` tokens (see gpu_bench.h).
void fill_to_depth(const cuda::CudaDecoderModel& model, LayerCaches& caches, int64_t depth,
                   uint64_t seed) {
  if (depth <= 0) return;
  cuda::DeviceCacheContext& context = model.cache_context();
  const int64_t first = std::min<int64_t>(depth, cuda::kBlockTokens);
  for (size_t l = 0; l < caches.size(); ++l) {
    cuda::DeviceKVCache& cache = device_cache(caches, l);
    const size_t n = size_t(first) * cache.kv_heads() * cache.head_dim();
    cuda::DeviceBuffer<float> k(n), v(n);
    cuda::fill_normal(k.data(), int64_t(n), seed + 2 * l, 1.0f, context.stream());
    cuda::fill_normal(v.data(), int64_t(n), seed + 2 * l + 1, 1.0f, context.stream());
    cache.append_device(k.data(), v.data(), int(first));
    const int64_t rest = depth - first;
    if (rest <= 0 || cache.window() > 0) {
      if (rest > 0) cache.append_device(k.data(), v.data(), int(std::min<int64_t>(rest, first)));
      continue;
    }
    cache.reserve_tokens(int(rest));
    const size_t bytes = cache.format().block_bytes();
    for (size_t b = 1; b < cache.blocks().size(); ++b) {
      TURBOKV_CUDA_CHECK(cudaMemcpyAsync(cache.blocks()[b], cache.blocks()[0], bytes,
                                         cudaMemcpyDeviceToDevice, context.stream()));
    }
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context.stream()));
    cache.advance(int(rest));
  }
}

size_t dense_bytes(const cuda::CudaDecoderModel& model, int64_t tokens) {
  size_t per_token = 0;
  for (const LayerSpec& l : model.layer_specs()) per_token += size_t(l.kv_heads) * l.head_dim * 4;
  return per_token * size_t(tokens);
}

}  // namespace

GpuDecodeResult gpu_decode(const cuda::CudaDecoderModel& model, const ResolvedKV& kv, int batch,
                           int64_t depth, int warmup, int steps) {
  if (batch < 1 || depth < 0 || warmup < 0 || steps < 1) {
    throw InvalidArgument(str_cat("gpu_decode: batch ", batch, ", depth ", depth, ", warmup ",
                                  warmup, ", steps ", steps));
  }
  const int V = model.info().vocab_size;
  std::vector<LayerCaches> caches;
  for (int b = 0; b < batch; ++b) {
    caches.push_back(model.make_caches(kv));
    fill_to_depth(model, caches.back(), depth, 1000 + uint64_t(b) * 101);
  }
  std::vector<std::vector<float>> logits(static_cast<size_t>(batch),
                                         std::vector<float>(static_cast<size_t>(V)));
  std::vector<int32_t> tokens(static_cast<size_t>(batch));
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> token(0, V - 1);
  auto step = [&] {
    std::vector<Model::Chunk> chunks;
    for (int b = 0; b < batch; ++b) {
      tokens[size_t(b)] = token(gen);
      chunks.push_back({&tokens[size_t(b)], 1, &caches[size_t(b)], logits[size_t(b)].data(), false});
    }
    model.forward(chunks);
  };
  for (int i = 0; i < warmup; ++i) step();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  GpuDecodeResult r;
  r.batch = batch;
  r.depth = depth + warmup;
  r.tokens_per_s = double(batch) * steps / seconds;
  r.ms_per_step = 1e3 * seconds / steps;
  for (const auto& c : caches.front()) r.kv_bytes += c->nbytes();
  r.kv_bytes_dense = dense_bytes(model, caches.front().front()->size());
  return r;
}

double gpu_prefill_tokens_per_s(const cuda::CudaDecoderModel& model, const ResolvedKV& kv,
                                int tokens, int chunk) {
  if (tokens < 1 || chunk < 1) {
    throw InvalidArgument(str_cat("gpu_prefill: ", tokens, " tokens in chunks of ", chunk));
  }
  const int V = model.info().vocab_size;
  std::mt19937 gen(11);
  std::uniform_int_distribution<int32_t> token(0, V - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(tokens));
  for (int32_t& t : prompt) t = token(gen);
  std::vector<float> logits(static_cast<size_t>(V));
  auto run = [&] {
    LayerCaches caches = model.make_caches(kv);
    for (int begin = 0; begin < tokens; begin += chunk) {
      const int n = std::min(chunk, tokens - begin);
      Model::Chunk c{prompt.data() + begin, n, &caches, begin + n == tokens ? logits.data() : nullptr,
                     false};
      model.forward({&c, 1});
    }
  };
  run();  // loads every kernel the shapes use
  const auto start = Clock::now();
  run();
  return double(tokens) / std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t gpu_max_depth(const cuda::CudaDecoderModel& model, const ResolvedKV& kv) {
  // Block sizes of one sequence's layers, then the largest depth whose blocks fit the pool's
  // chunks (a chunk serves one block size).
  LayerCaches probe = model.make_caches(kv);
  std::vector<size_t> block_bytes;
  for (size_t l = 0; l < probe.size(); ++l) {
    block_bytes.push_back(device_cache(probe, l).format().block_bytes());
  }
  probe.clear();
  const cuda::PoolStats pool = model.cache_context().pool().stats();
  const int64_t free_chunks = pool.chunks_total - pool.chunks_in_use;
  auto chunks_for = [&](int64_t depth) {
    std::vector<std::pair<size_t, int64_t>> per_size;  // block bytes -> blocks
    const int64_t blocks = (depth + cuda::kBlockTokens - 1) / cuda::kBlockTokens;
    for (size_t b : block_bytes) {
      auto it = std::find_if(per_size.begin(), per_size.end(),
                             [&](const auto& p) { return p.first == b; });
      if (it == per_size.end()) {
        per_size.emplace_back(b, blocks);
      } else {
        it->second += blocks;
      }
    }
    int64_t chunks = 0;
    for (const auto& [bytes, n] : per_size) {
      const int64_t per_chunk = int64_t(cuda::DeviceBlockPool::kChunkBytes / bytes);
      chunks += (n + per_chunk - 1) / per_chunk;
    }
    return chunks;
  };
  int64_t lo = 0, hi = int64_t(1) << 40;
  while (lo < hi) {  // the largest depth whose chunks fit
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (chunks_for(mid) <= free_chunks - 1) lo = mid; else hi = mid - 1;
  }
  return std::min<int64_t>(lo / cuda::kBlockTokens * cuda::kBlockTokens,
                           model.info().max_position_embeddings);
}

}  // namespace turbokv::eval
