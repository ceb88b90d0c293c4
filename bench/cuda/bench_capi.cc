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

// k, v [batch, n_new, kv_heads, 128] fp32 -> tiles [batch, kv_heads, max_tiles, 3712].
double tkv_tq_quantize(const float* k, const float* v, const int* start, uint8_t* tiles, int batch,
                       int n_new, int kv_heads, int max_tiles, uint64_t seed) {
  return guarded([&] {
    tq_quantize(codec_for(seed).kernel_codec(),
                {k, v, start, tiles, batch, n_new, kv_heads, max_tiles}, nullptr);
    TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    return 0.0;
  });
}

// Block timelines of `reps` single calls (each synchronized): host_out [reps, max_blocks,
// attn::kTimelinePoints] u64, zero where no block stamped. Returns the number of u64 written.
double tkv_tq_timeline(const uint8_t* tiles, int max_tiles, const int* seq_lens, int max_len,
                       const float* q, int batch, int n_heads, int kv_heads, float scale,
                       float* out, uint64_t seed, int reps, int max_blocks,
                       unsigned long long* host_out) {
  return guarded([&] {
    AttentionProblem p = problem(seq_lens, max_len, q, batch, n_heads, kv_heads, scale, out);
    const size_t bytes = attention_workspace_bytes(p, CacheKind::kTurboQuant);
    DeviceBuffer<uint8_t> workspace(bytes);
    workspace.zero();
    const size_t per_rep = size_t(max_blocks) * attn::kTimelinePoints;
    DeviceBuffer<unsigned long long> timeline(per_rep);
    const TQKernelCodec& codec = codec_for(seed).kernel_codec();
    tq_attention(codec, {tiles, max_tiles}, p, workspace.data(), bytes, nullptr);  // warm-up
    p.timeline = timeline.data();
    for (int r = 0; r < reps; ++r) {
      timeline.zero();
      tq_attention(codec, {tiles, max_tiles}, p, workspace.data(), bytes, nullptr);
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
// tiles: `copies` caches of copy_bytes each; k, v: `copies` caches [batch, kv_heads,
// capacity, 128] fp16 of copy_elems each; out [batch, 1, n_heads, 128] fp32.
void* tkv_tq_graph(const uint8_t* tiles, int max_tiles, int copies, size_t copy_bytes,
                   const int* seq_lens, int max_len, const float* q, int batch, int n_heads,
                   int kv_heads, float scale, float* out, uint64_t seed, int calls,
                   int programmatic) {
  AttentionProblem p = problem(seq_lens, max_len, q, batch, n_heads, kv_heads, scale, out);
  p.programmatic_launch = programmatic != 0;
  return graph_of_calls(p, CacheKind::kTurboQuant, copies, calls,
                        [&](int copy, cudaStream_t stream, void* ws, size_t bytes) {
                          tq_attention(codec_for(seed).kernel_codec(),
                                       {tiles + copy * copy_bytes, max_tiles}, p, ws, bytes,
                                       stream);
                        });
}

void* tkv_dense_graph(const uint16_t* k, const uint16_t* v, int capacity, int copies,
                      size_t copy_elems, const int* seq_lens, int max_len, const float* q,
                      int batch, int n_heads, int kv_heads, float scale, float* out, int calls) {
  const AttentionProblem p = problem(seq_lens, max_len, q, batch, n_heads, kv_heads, scale, out);
  return graph_of_calls(p, CacheKind::kDense, copies, calls,
                        [&](int copy, cudaStream_t stream, void* ws, size_t bytes) {
                          const DenseCacheView cache{
                              reinterpret_cast<const __half*>(k + copy * copy_elems),
                              reinterpret_cast<const __half*>(v + copy * copy_elems), capacity};
                          dense_attention(cache, p, ws, bytes, stream);
                        });
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
