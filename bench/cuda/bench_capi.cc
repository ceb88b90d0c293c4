// C entry points for attention_bench.py (ctypes). Inputs are device pointers owned by
// PyTorch. Timing: `calls` attention calls (kernel + merge each) are captured in one CUDA graph,
// cycling over `copies` cache copies (so the data is read from HBM, not from L2 as it would
// be by repeating one small cache); the graph is launched `reps` times, each timed with CUDA
// events; the median divided by `calls` is returned in microseconds. On error: -1 and
// tkv_last_error() says why.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
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

// call(copy, stream) queues one attention call on cache copy `copy`.
double time_graph(const std::function<void(int, cudaStream_t)>& call, int copies, int calls,
                  int reps) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  call(0, stream);  // warm-up outside the graph (module load, attribute setup)
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TURBOKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) call(i % copies, stream);
  TURBOKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TURBOKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  TURBOKV_CUDA_CHECK(cudaEventCreate(&start));
  TURBOKV_CUDA_CHECK(cudaEventCreate(&stop));
  TURBOKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm
  std::vector<float> ms(reps);
  for (int r = 0; r < reps; ++r) {
    TURBOKV_CUDA_CHECK(cudaEventRecord(start, stream));
    TURBOKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TURBOKV_CUDA_CHECK(cudaEventRecord(stop, stream));
    TURBOKV_CUDA_CHECK(cudaEventSynchronize(stop));
    TURBOKV_CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
  }
  std::sort(ms.begin(), ms.end());
  TURBOKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TURBOKV_CUDA_CHECK(cudaGraphDestroy(graph));
  TURBOKV_CUDA_CHECK(cudaEventDestroy(start));
  TURBOKV_CUDA_CHECK(cudaEventDestroy(stop));
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
  return 1000.0 * ms[reps / 2] / calls;
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

// tiles: `copies` caches of copy_bytes each. out [batch, 1, n_heads, 128] fp32.
// shape: 0 auto, 1 deep (12 warps x 3 stages), 2 wide (16 warps x 2 stages).
double tkv_time_tq_attention(const uint8_t* tiles, int max_tiles, int copies, size_t copy_bytes,
                             const int* seq_lens, int max_len, const float* q, int batch,
                             int n_heads, int kv_heads, float scale, float* out, uint64_t seed,
                             int shape, int calls, int reps) {
  return guarded([&] {
    AttentionProblem p = problem(seq_lens, max_len, q, batch, n_heads, kv_heads, scale, out);
    p.tq_shape = shape == 1   ? TQBlockShape::kDeep
                 : shape == 2 ? TQBlockShape::kWide
                              : TQBlockShape::kAuto;
    const size_t bytes = attention_workspace_bytes(p, CacheKind::kTurboQuant);
    DeviceBuffer<uint8_t> workspace(bytes);
    workspace.zero();
    const TQKernelCodec& codec = codec_for(seed).kernel_codec();
    return time_graph(
        [&](int copy, cudaStream_t stream) {
          tq_attention(codec, {tiles + copy * copy_bytes, max_tiles}, p, workspace.data(), bytes,
                       stream);
        },
        copies, calls, reps);
  });
}

// k, v: `copies` caches [batch, kv_heads, capacity, 128] fp16 of copy_elems each.
double tkv_time_dense_attention(const uint16_t* k, const uint16_t* v, int capacity, int copies,
                                size_t copy_elems, const int* seq_lens, int max_len, const float* q,
                                int batch, int n_heads, int kv_heads, float scale, float* out,
                                int calls, int reps) {
  return guarded([&] {
    const AttentionProblem p = problem(seq_lens, max_len, q, batch, n_heads, kv_heads, scale, out);
    const size_t bytes = attention_workspace_bytes(p, CacheKind::kDense);
    DeviceBuffer<uint8_t> workspace(bytes);
    workspace.zero();
    return time_graph(
        [&](int copy, cudaStream_t stream) {
          const DenseCacheView cache{reinterpret_cast<const __half*>(k + copy * copy_elems),
                                     reinterpret_cast<const __half*>(v + copy * copy_elems),
                                     capacity};
          dense_attention(cache, p, workspace.data(), bytes, stream);
        },
        copies, calls, reps);
  });
}

}  // extern "C"
