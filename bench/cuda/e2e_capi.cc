// C entry points for e2e_bench.py (ctypes): the CUDA engine's whole-model decode and prefill
// timed in the process that also runs the PyTorch baseline. On error: a negative value (or
// nullptr) and tkv_e2e_error() says why.
#include <memory>
#include <string>

#include "core/error.h"
#include "eval/gpu_bench.h"
#include "kv/kv_resolve.h"
#include "model/cuda/cuda_decoder.h"
#include "model/decoder.h"

namespace {

using namespace turbokv;

std::string g_error;

template <typename Fn>
auto guarded(Fn fn, decltype(fn()) failed) {
  try {
    return fn();
  } catch (const std::exception& e) {
    g_error = e.what();
    return failed;
  }
}

// "dense", or kv_bits with an optional scheme and allocation, BITS[:SCHEME[:ALLOCATION]], e.g.
// "3.5", "4:uniform", "3.5:turboquant:none"; a "+last" suffix quantizes the last layer too
// (the engine keeps it dense by default), e.g. "3.5+last".
ResolvedKV parse_kv(const char* spec) {
  std::string s = spec;
  if (s == "dense") return ResolvedKV{};
  KVOptions o;
  const std::string kLast = "+last";
  if (s.size() > kLast.size() && s.compare(s.size() - kLast.size(), kLast.size(), kLast) == 0) {
    o.last_layer_dense = false;
    s.resize(s.size() - kLast.size());
  }
  const size_t colon = s.find(':');
  o.kv_bits = parse_kv_bits(s.substr(0, colon));
  if (colon != std::string::npos) {
    const std::string rest = s.substr(colon + 1);
    const size_t second = rest.find(':');
    o.kv_quant_scheme = rest.substr(0, second);
    if (second != std::string::npos) o.kv_allocation = rest.substr(second + 1);
  }
  return resolve_kv_options(o);
}

const cuda::CudaDecoderModel& model_of(void* h) {
  return *static_cast<cuda::CudaDecoderModel*>(h);
}

}  // namespace

extern "C" {

const char* tkv_e2e_error() { return g_error.c_str(); }

// Loads a model directory onto the GPU with a KV pool of kv_cache_gb GB (0: 90% of what is
// free); returns a handle or nullptr.
void* tkv_e2e_open(const char* model_dir, double kv_cache_gb) {
  return guarded(
      [&]() -> void* {
        std::unique_ptr<Model> model = Model::load(model_dir);
        auto* decoder = dynamic_cast<DecoderModel*>(model.get());
        if (decoder == nullptr) throw Unsupported("not a decoder model");
        model.release();
        cuda::CudaModelOptions options;
        options.kv_cache_bytes = size_t(kv_cache_gb * double(1ull << 30));
        return new cuda::CudaDecoderModel(std::unique_ptr<DecoderModel>(decoder), options);
      },
      static_cast<void*>(nullptr));
}

void tkv_e2e_close(void* h) { delete static_cast<cuda::CudaDecoderModel*>(h); }

// Decode tokens/s of `batch` sequences whose caches hold `depth` tokens; kv_bytes_out (may be
// null): one sequence's cache bytes and their fp16 equivalent.
double tkv_e2e_decode(void* h, const char* kv, int batch, long long depth, int warmup, int steps,
                      unsigned long long* kv_bytes_out) {
  return guarded(
      [&] {
        const eval::GpuDecodeResult r =
            eval::gpu_decode(model_of(h), parse_kv(kv), batch, depth, warmup, steps);
        if (kv_bytes_out != nullptr) {
          kv_bytes_out[0] = r.kv_bytes;
          kv_bytes_out[1] = r.kv_bytes_dense;
        }
        return r.tokens_per_s;
      },
      -1.0);
}

double tkv_e2e_prefill(void* h, const char* kv, int tokens) {
  return guarded([&] { return eval::gpu_prefill_tokens_per_s(model_of(h), parse_kv(kv), tokens); },
                 -1.0);
}

long long tkv_e2e_max_depth(void* h, const char* kv) {
  return guarded([&] { return (long long)eval::gpu_max_depth(model_of(h), parse_kv(kv)); },
                 -1LL);
}

}  // extern "C"
