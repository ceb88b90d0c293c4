// Decode-attention timing of the paged KV kernels (kernels/cuda/kvcache/paged.h) on the GPU:
// every format at the same shape and context, in one run, next to the fused fp16 and
// TurboQuant 3.5 kernels on their paged blocks (kernels/cuda/attention.h).
// Each call is timed as a replay of a captured CUDA graph of `--calls` back-to-back calls;
// prints microseconds per call, the cache bytes a call reads, the implied bandwidth and the
// ratio to the dense fp16 paged cache.
//
//   paged_attention_bench [--ctx 4096,32768,131072] [--batch 1] [--heads 32] [--kv-heads 8]
//                         [--calls 20] [--reps 5]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/kvcache/formats.h"
#include "kernels/cuda/kvcache/paged.h"
#include "kernels/cuda/tq_codec.h"
#include "kernels/cuda/tq_quantize.h"
#include "quant/codec.h"

namespace {

using namespace turbokv;
using namespace turbokv::cuda;

constexpr int kHeadDim = 128;

struct Options {
  std::vector<int> contexts = {4096, 32768, 131072};
  int batch = 1;
  int heads = 32;
  int kv_heads = 8;
  int calls = 20;
  int reps = 5;
};

int parse_int(const std::string& s, const std::string& what) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || v < 1) {
    throw InvalidArgument(
        str_cat("paged_attention_bench: ", what, " ", s, " is invalid: need a positive integer"));
  }
  return v;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(parse_int(item, "--ctx"));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc)
      throw InvalidArgument(str_cat("paged_attention_bench: ", arg, " needs a value"));
    const std::string value = argv[++i];
    if (arg == "--ctx") {
      o.contexts = parse_list(value);
    } else if (arg == "--batch") {
      o.batch = parse_int(value, arg);
    } else if (arg == "--heads") {
      o.heads = parse_int(value, arg);
    } else if (arg == "--kv-heads") {
      o.kv_heads = parse_int(value, arg);
    } else if (arg == "--calls") {
      o.calls = parse_int(value, arg);
    } else if (arg == "--reps") {
      o.reps = parse_int(value, arg);
    } else {
      throw InvalidArgument(str_cat("paged_attention_bench: unknown option ", arg,
                                    " (allowed: --ctx --batch --heads --kv-heads --calls --reps)"));
    }
  }
  return o;
}

// Median microseconds per call of `call` replayed from a graph of o.calls calls.
double time_calls(const Options& o, const std::function<void(cudaStream_t)>& call) {
  cudaStream_t stream;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  call(stream);  // warm-up outside the graph (module load, attributes)
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TURBOKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < o.calls; ++i) call(stream);
  TURBOKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TURBOKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  TURBOKV_CUDA_CHECK(cudaEventCreate(&start));
  TURBOKV_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int r = 0; r < o.reps + 1; ++r) {
    TURBOKV_CUDA_CHECK(cudaEventRecord(start, stream));
    TURBOKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TURBOKV_CUDA_CHECK(cudaEventRecord(stop, stream));
    TURBOKV_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TURBOKV_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r > 0) us.push_back(1000.0 * ms / o.calls);  // the first replay warms the graph
  }
  TURBOKV_CUDA_CHECK(cudaEventDestroy(start));
  TURBOKV_CUDA_CHECK(cudaEventDestroy(stop));
  TURBOKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TURBOKV_CUDA_CHECK(cudaGraphDestroy(graph));
  TURBOKV_CUDA_CHECK(cudaStreamDestroy(stream));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// One paged cache of `ctx` tokens per sequence, filled by paged_append from random K/V, and a
// decode call over it.
class PagedCase {
 public:
  PagedCase(const Options& o, int ctx, const BlockGeometry& g,
            const std::function<void(const PagedBatch&, const AppendRows&)>& append)
      : o_(o), ctx_(ctx), block_bytes_(g.block_bytes) {
    const int blocks = (ctx + kBlockTokens - 1) / kBlockTokens;
    pool_ = DeviceBuffer<uint8_t>(size_t(o.batch) * blocks * block_bytes_);
    std::vector<uint8_t*> table(size_t(o.batch) * blocks);
    for (size_t i = 0; i < table.size(); ++i) table[i] = pool_.data() + i * block_bytes_;
    table_ = DeviceBuffer<uint8_t*>::upload(table);
    len_ = DeviceBuffer<int>::upload(std::vector<int>(o.batch, ctx));
    batch_.block_table = table_.data();
    batch_.table_stride = blocks;
    batch_.seq_len = len_.data();
    batch_.batch = o.batch;
    batch_.max_len = ctx;
    // Append in chunks of 4096 tokens per sequence.
    const int chunk = std::min(ctx, 4096);
    std::mt19937_64 rng(7);
    std::normal_distribution<float> dist;
    std::vector<float> kv(size_t(o.batch) * chunk * o.kv_heads * kHeadDim);
    for (auto& x : kv) x = dist(rng);
    auto d_k = DeviceBuffer<float>::upload(kv);
    for (int first = 0; first < ctx; first += chunk) {
      const int n = std::min(chunk, ctx - first);
      std::vector<int> seq, pos;
      for (int b = 0; b < o.batch; ++b) {
        for (int t = 0; t < n; ++t) seq.push_back(b), pos.push_back(first + t);
      }
      auto d_seq = DeviceBuffer<int>::upload(seq);
      auto d_pos = DeviceBuffer<int>::upload(pos);
      append(batch_,
             AppendRows{d_k.data(), d_k.data(), d_seq.data(), d_pos.data(), int(seq.size())});
      TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
    }
    std::vector<float> q(size_t(o.batch) * o.heads * kHeadDim);
    for (auto& x : q) x = dist(rng);
    q_ = DeviceBuffer<float>::upload(q);
    out_ = DeviceBuffer<float>(q.size());
    std::vector<int> start(o.batch + 1);
    for (int b = 0; b <= o.batch; ++b) start[b] = b;
    q_start_ = DeviceBuffer<int>::upload(start);
    queries_ = QueryRows{q_.data(), out_.data(), q_start_.data(), 1};
    options_.n_heads = o.heads;
    options_.scale = 0.088f;
    workspace_ = DeviceBuffer<uint8_t>(
        paged_attention_workspace_bytes(batch_, queries_, options_, o.kv_heads, kHeadDim));
  }

  double time(const std::function<void(const PagedBatch&, const QueryRows&, const AttentionOptions&,
                                       void*, size_t, cudaStream_t)>& attend) {
    return time_calls(o_, [&](cudaStream_t s) {
      attend(batch_, queries_, options_, workspace_.data(), workspace_.size(), s);
    });
  }
  double bytes_read() const { return double(o_.batch) * ctx_ * block_bytes_ / kBlockTokens; }
  const PagedBatch& batch() const { return batch_; }
  // The fused kernels' problem for the same decode step (kernels/cuda/attention.h).
  AttentionProblem fused_problem() const {
    AttentionProblem p;
    p.q = queries_.q;
    p.seq_lens = batch_.seq_len;
    p.out = queries_.out;
    p.batch = batch_.batch;
    p.n_heads = options_.n_heads;
    p.kv_heads = o_.kv_heads;
    p.max_len = batch_.max_len;
    p.scale = options_.scale;
    return p;
  }

 private:
  const Options& o_;
  int ctx_;
  size_t block_bytes_;
  DeviceBuffer<uint8_t> pool_;
  DeviceBuffer<uint8_t*> table_;
  DeviceBuffer<int> len_, q_start_;
  DeviceBuffer<float> q_, out_;
  DeviceBuffer<uint8_t> workspace_;
  PagedBatch batch_;
  QueryRows queries_;
  AttentionOptions options_;
};

struct TQSpec {
  const char* name;
  double key_bits, value_bits;
};

void run(const Options& o) {
  std::printf(
      "decode, batch %d, %d query / %d KV heads, head_dim %d; graph of %d calls, median "
      "of %d\n",
      o.batch, o.heads, o.kv_heads, kHeadDim, o.calls, o.reps);
  std::printf("%-28s %8s %10s %10s %8s %10s\n", "cache", "ctx", "us/call", "MB read", "GB/s",
              "vs f16");
  const std::vector<TQSpec> specs = {{"paged turboquant K3/V4", 3, 4},
                                     {"paged turboquant K2/V2", 2, 2},
                                     {"paged turboquant K4/V4", 4, 4},
                                     {"paged turboquant K3.5/V4", 3.5, 4}};
  for (int ctx : o.contexts) {
    auto row = [&](const char* name, double us, double bytes, double base) {
      std::printf("%-28s %8d %10.1f %10.1f %8.0f %10.2f\n", name, ctx, us, bytes / 1e6,
                  bytes / us / 1e3, base / us);
    };
    const DenseFormat dense{DenseElem::kF16, o.kv_heads, kHeadDim};
    double base = 0;
    {
      PagedCase c(o, ctx, block_geometry(dense), [&](const PagedBatch& b, const AppendRows& r) {
        paged_append(dense, b, r, nullptr);
      });
      base = c.time([&](auto&&... args) { paged_attention(dense, args...); });
      row("paged dense f16", base, c.bytes_read(), base);
      // The fused fp16 kernel (attention/dense_attention.cu) on the same blocks.
      const AttentionProblem p = c.fused_problem();
      DeviceBuffer<uint8_t> ws(attention_workspace_bytes(p, CacheKind::kDense));
      ws.zero();
      const DenseCacheView view{c.batch().block_table, c.batch().table_stride};
      const double us =
          time_calls(o, [&](cudaStream_t s) { dense_attention(view, p, ws.data(), ws.size(), s); });
      row("fused dense f16", us, c.bytes_read(), base);
    }
    for (const TQSpec& spec : specs) {
      std::unique_ptr<quant::TurboQuantCodec> codecs[2];
      for (int role = 0; role < 2; ++role) {
        quant::TurboQuantConfig config;
        config.dim = kHeadDim;
        config.bits = role == 0 ? spec.key_bits : spec.value_bits;
        config.role = role == 0 ? quant::TensorRole::kKey : quant::TensorRole::kValue;
        codecs[role] = quant::make_turboquant_codec(config);
      }
      // Split codecs take the natural channel order (no per-sequence state).
      const TQDeviceFormat format(o.kv_heads, *codecs[0], *codecs[1]);
      const TQFormat& f = format.format();
      PagedCase c(o, ctx, block_geometry(f), [&](const PagedBatch& b, const AppendRows& r) {
        paged_append(f, b, nullptr, r, nullptr);
      });
      const double us =
          c.time([&](const PagedBatch& b, const QueryRows& q, const AttentionOptions& opt, void* ws,
                     size_t bytes,
                     cudaStream_t s) { paged_attention(f, b, nullptr, q, opt, ws, bytes, s); });
      row(spec.name, us, c.bytes_read(), base);
    }
    {  // the fused K3/V4 kernel (attention/tq_attention.cu) on its paged tile format
      const TQDeviceCodec codec(0);
      PagedCase c(o, ctx, block_geometry_tq35(o.kv_heads),
                  [&](const PagedBatch& b, const AppendRows& r) {
                    TQQuantizeProblem p;
                    p.k = r.k;
                    p.v = r.v;
                    p.row_seq = r.row_seq;
                    p.row_pos = r.row_pos;
                    p.rows = r.rows;
                    p.kv_heads = o.kv_heads;
                    p.block_table = const_cast<uint8_t* const*>(b.block_table);
                    p.table_stride = b.table_stride;
                    tq_quantize(codec.kernel_codec(), p, nullptr);
                  });
      const AttentionProblem p = c.fused_problem();
      DeviceBuffer<uint8_t> ws(attention_workspace_bytes(p, CacheKind::kTurboQuant));
      ws.zero();
      const TQCacheView view{c.batch().block_table, c.batch().table_stride, nullptr};
      const double us = time_calls(o, [&](cudaStream_t s) {
        tq_attention(codec.kernel_codec(), view, p, ws.data(), ws.size(), s);
      });
      row("fused turboquant K3/V4", us, c.bytes_read(), base);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (!device_available()) {
      std::fprintf(stderr, "paged_attention_bench: no CUDA device\n");
      return 1;
    }
    run(o);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "paged_attention_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
