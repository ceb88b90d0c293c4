// C entry points for attention_bench.py (ctypes). Inputs are device pointers owned by
// PyTorch. On error: -1 (or nullptr) and tkv_last_error() says why.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/tq_codec.h"
#include "kernels/cuda/tq_layout.h"
#include "kernels/cuda/tq_quantize.h"

namespace {

using namespace turbokv::cuda;

std::string g_error;

const TQDeviceCodec& codec_for(uint64_t seed) {
  static std::vector<std::unique_ptr<TQDeviceCodec>> codecs;
  static std::vector<uint64_t> seeds;
  for (size_t i = 0; i < seeds.size(); ++i)
    if (seeds[i] == seed) return *codecs[i];
  codecs.push_back(std::make_unique<TQDeviceCodec>(seed));
  seeds.push_back(seed);
  return *codecs.back();
}

// A captured graph of `calls` attention calls that can be replayed one timing at a time, so the
// Python driver can interleave the methods it compares (clock drift hits all of them alike).
struct TimedGraph {
  cudaStream_t stream = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  int calls = 0;
  std::unique_ptr<DeviceBuffer<uint8_t>> workspace;
  std::shared_ptr<const void> tables;  // the block tables the graph reads
  ~TimedGraph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  }
};

TimedGraph* capture(const std::function<void(int, cudaStream_t)>& call, int copies, int calls) {
  auto g = std::make_unique<TimedGraph>();
  g->calls = calls;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
  call(0, g->stream);  // warm-up outside the graph (module load, attribute setup)
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(g->stream));
  cudaGraph_t graph;
  TURBOKV_CUDA_CHECK(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) call(i % copies, g->stream);
  TURBOKV_CUDA_CHECK(cudaStreamEndCapture(g->stream, &graph));
  TURBOKV_CUDA_CHECK(cudaGraphInstantiate(&g->exec, graph, 0));
  TURBOKV_CUDA_CHECK(cudaGraphDestroy(graph));
  TURBOKV_CUDA_CHECK(cudaEventCreate(&g->start));
  TURBOKV_CUDA_CHECK(cudaEventCreate(&g->stop));
  TURBOKV_CUDA_CHECK(cudaGraphLaunch(g->exec, g->stream));  // warm
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(g->stream));
  return g.release();
}

template <typename Fn>
double guarded(Fn fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    g_error = e.what();
    return -1;
  }
}

AttentionProblem problem(const int* seq_lens, int max_len, const float* q, int batch, int n_heads,
                         int kv_heads, float scale, float* out) {
  AttentionProblem p;
  p.q = q;
  p.seq_lens = seq_lens;
  p.out = out;
  p.batch = batch;
  p.n_q = 1;
  p.n_heads = n_heads;
  p.kv_heads = kv_heads;
  p.max_len = max_len;
  p.scale = scale;
  return p;
}

// Block tables of `copies` caches laid out as consecutive blocks: copy c, sequence b, block i
// at base + c * copy_bytes + (b * n_blocks + i) * block_bytes; [copies][batch, n_blocks].
struct ContiguousTables {
  DeviceBuffer<uint8_t*> table;
  int n_blocks = 0, batch = 0;
  ContiguousTables(const uint8_t* base, int copies, size_t copy_bytes, int batch_, int n_blocks_,
                   size_t block_bytes)
      : n_blocks(n_blocks_), batch(batch_) {
    std::vector<uint8_t*> host;
    for (int c = 0; c < copies; ++c) {
      for (int i = 0; i < batch * n_blocks; ++i) {
        host.push_back(const_cast<uint8_t*>(base) + c * copy_bytes + size_t(i) * block_bytes);
      }
    }
    table = DeviceBuffer<uint8_t*>::upload(host);
  }
  uint8_t* const* of_copy(int c) const { return table.data() + size_t(c) * batch * n_blocks; }
};

size_t tq_block_bytes(int kv_heads) {
  return size_t(kv_heads) * kTilesPerBlock * TQ35Layout::kTileBytes;
}

// A TimedGraph of `calls` calls attend(copy, stream, workspace, workspace_bytes), with a
// zeroed workspace sized for p that the graph owns; nullptr (and g_error) on error.
template <typename Attend>
void* graph_of_calls(const AttentionProblem& p, CacheKind kind, int copies, int calls,
                     Attend attend) {
  TimedGraph* handle = nullptr;
  guarded([&] {
    const size_t bytes = attention_workspace_bytes(p, kind);
    auto workspace = std::make_unique<DeviceBuffer<uint8_t>>(bytes);
    workspace->zero();
    void* ws = workspace->data();
    handle = capture([&](int copy, cudaStream_t stream) { attend(copy, stream, ws, bytes); },
                     copies, calls);
    handle->workspace = std::move(workspace);
    return 0.0;
  });
  return handle;
}

}  // namespace

extern "C" {

const char* tkv_last_error() {
  return g_error.c_str();
}

int tkv_tq_tile_bytes() {
  return TQ35Layout::kTileBytes;
}

// k, v [batch, n_new, kv_heads, 128] fp32 -> paged blocks: sequence b's n_blocks blocks of
// [kv_heads][8][3712 B] at tiles + b * n_blocks * block bytes, positions 0 .. n_new - 1.
double tkv_tq_quantize(const float* k, const float* v, uint8_t* tiles, int batch, int n_new,
                       int kv_heads, int n_blocks, uint64_t seed) {
  return guarded([&] {
    const ContiguousTables tables(tiles, 1, 0, batch, n_blocks, tq_block_bytes(kv_heads));
    std::vector<int> seq, pos;
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < n_new; ++i) seq.push_back(b), pos.push_back(i);
    }
    auto d_seq = DeviceBuffer<int>::upload(seq);
    auto d_pos = DeviceBuffer<int>::upload(pos);
    TQQuantizeProblem p;
    p.k = k;
    p.v = v;
    p.row_seq = d_seq.data();
    p.row_pos = d_pos.data();
    p.rows = batch * n_new;
    p.kv_heads = kv_heads;
    p.block_table = tables.of_copy(0);
    p.table_stride = n_blocks;
    tq_quantize(codec_for(seed).kernel_codec(), p, nullptr);
    TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    return 0.0;
  });
}

// Block timelines of `reps` single calls (each synchronized): host_out [reps, max_blocks,
// attn::kTimelinePoints] u64, zero where no block stamped. Returns the number of u64 written.
double tkv_tq_timeline(const uint8_t* tiles, int n_blocks, const int* seq_lens, int max_len,
                       const float* q, int batch, int n_heads, int kv_heads, float scale,
                       float* out, uint64_t seed, int reps, int max_blocks,
                       unsigned long long* host_out) {
  return guarded([&] {
    const ContiguousTables tables(tiles, 1, 0, batch, n_blocks, tq_block_bytes(kv_heads));
    TQCacheView cache;
    cache.block_table = tables.of_copy(0);
    cache.table_stride = n_blocks;
    AttentionProblem p = problem(seq_lens, max_len, q, batch, n_heads, kv_heads, scale, out);
    const size_t bytes = attention_workspace_bytes(p, CacheKind::kTurboQuant);
    DeviceBuffer<uint8_t> workspace(bytes);
    workspace.zero();
    const size_t per_rep = size_t(max_blocks) * attn::kTimelinePoints;
    DeviceBuffer<unsigned long long> timeline(per_rep);
    const TQKernelCodec& codec = codec_for(seed).kernel_codec();
    tq_attention(codec, cache, p, workspace.data(), bytes, nullptr);  // warm-up
    p.timeline = timeline.data();
    for (int r = 0; r < reps; ++r) {
      timeline.zero();
      tq_attention(codec, cache, p, workspace.data(), bytes, nullptr);
      TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
      TURBOKV_CUDA_CHECK(cudaMemcpy(host_out + r * per_rep, timeline.data(),
                                    per_rep * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    }
    return double(reps * per_rep);
  });
}

// Timing: tkv_tq_graph / tkv_dense_graph capture `calls` attention calls (kernel + merge each;
// tkv_tq_graph: with programmatic dependent launch when `programmatic`) in one CUDA graph,
// cycling over `copies` cache copies (so the data is read from HBM, not from L2 as it would be
// by repeating one small cache), and return a handle (nullptr on error); tkv_graph_us replays
// it once and returns µs per call; tkv_graph_free releases it.
// tiles / blocks: `copies` paged caches of copy_bytes each, sequence b's n_blocks blocks
// consecutive (TurboQuant blocks [kv_heads][8][3712 B]; dense [K: kv_heads][256][128] |
// [V: ...] fp16); out [batch, 1, n_heads, 128] fp32.
void* tkv_tq_graph(const uint8_t* tiles, int n_blocks, int copies, size_t copy_bytes,
                   const int* seq_lens, int max_len, const float* q, int batch, int n_heads,
                   int kv_heads, float scale, float* out, uint64_t seed, int calls,
                   int programmatic) {
  AttentionProblem p = problem(seq_lens, max_len, q, batch, n_heads, kv_heads, scale, out);
  p.programmatic_launch = programmatic != 0;
  auto tables = std::make_shared<ContiguousTables>(tiles, copies, copy_bytes, batch, n_blocks,
                                                   tq_block_bytes(kv_heads));
  void* handle = graph_of_calls(p, CacheKind::kTurboQuant, copies, calls,
                                [&](int copy, cudaStream_t stream, void* ws, size_t bytes) {
                                  TQCacheView cache;
                                  cache.block_table = tables->of_copy(copy);
                                  cache.table_stride = n_blocks;
                                  tq_attention(codec_for(seed).kernel_codec(), cache, p, ws,
                                               bytes, stream);
                                });
  if (handle != nullptr) static_cast<TimedGraph*>(handle)->tables = tables;
  return handle;
}

void* tkv_dense_graph(const uint8_t* blocks, int n_blocks, int copies, size_t copy_bytes,
                      const int* seq_lens, int max_len, const float* q, int batch, int n_heads,
                      int kv_heads, float scale, float* out, int calls) {
  const AttentionProblem p = problem(seq_lens, max_len, q, batch, n_heads, kv_heads, scale, out);
  auto tables = std::make_shared<ContiguousTables>(blocks, copies, copy_bytes, batch, n_blocks,
                                                   size_t(kv_heads) * 256 * 128 * 2 * 2);
  void* handle = graph_of_calls(p, CacheKind::kDense, copies, calls,
                                [&](int copy, cudaStream_t stream, void* ws, size_t bytes) {
                                  DenseCacheView cache;
                                  cache.block_table = tables->of_copy(copy);
                                  cache.table_stride = n_blocks;
                                  dense_attention(cache, p, ws, bytes, stream);
                                });
  if (handle != nullptr) static_cast<TimedGraph*>(handle)->tables = tables;
  return handle;
}

double tkv_graph_us(void* handle) {
  return guarded([&] {
    auto* g = static_cast<TimedGraph*>(handle);
    TURBOKV_CUDA_CHECK(cudaEventRecord(g->start, g->stream));
    TURBOKV_CUDA_CHECK(cudaGraphLaunch(g->exec, g->stream));
    TURBOKV_CUDA_CHECK(cudaEventRecord(g->stop, g->stream));
    TURBOKV_CUDA_CHECK(cudaEventSynchronize(g->stop));
    float ms = 0;
    TURBOKV_CUDA_CHECK(cudaEventElapsedTime(&ms, g->start, g->stop));
    return 1000.0 * ms / g->calls;
  });
}

void tkv_graph_free(void* handle) {
  delete static_cast<TimedGraph*>(handle);
}

}  // extern "C"
