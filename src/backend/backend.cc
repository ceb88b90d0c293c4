// load_model / check_device (backend.h).
#include "backend/backend.h"

#include <cmath>

#include "core/error.h"
#include "model/config.h"
#include "model/decoder.h"

#ifdef TURBOKV_HAVE_CUDA
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kvcache/paged.h"
#include "model/cuda/cuda_decoder.h"
#endif

namespace turbokv {

void check_device(const DeviceOptions& options) {
  if (options.device != "cpu" && options.device != "cuda") {
    throw InvalidArgument(str_cat("device '", options.device, "' is unknown; allowed: cpu, cuda"),
                          "device");
  }
  if (!std::isfinite(options.kv_cache_gb) || options.kv_cache_gb < 0 ||
      options.kv_cache_gb > 1e6) {
    throw InvalidArgument(str_cat("kv_cache_gb=", options.kv_cache_gb,
                                  " must be a number of GB in [0, 1e6] (0: automatic)"),
                          "kv_cache_gb");
  }
  if (options.batch_invariant && options.device != "cuda") {
    throw InvalidArgument(
        "--batch-invariant is for --device cuda (on the CPU, TURBOKV_EXACT_ATTENTION=1 keeps a "
        "request's greedy text equal alone and batched in practice)",
        "batch_invariant");
  }
  if (options.device != "cuda") return;
#ifdef TURBOKV_HAVE_CUDA
  if (!cuda::device_available()) {
    throw InvalidArgument(
        "--device cuda: no CUDA device is available on this machine (no NVIDIA GPU or driver "
        "found); use --device cpu",
        "device");
  }
#else
  throw InvalidArgument(
      "--device cuda: this build of turbokv has no CUDA support (nvcc was not found when it was "
      "built); use --device cpu",
      "device");
#endif
}

LoadedModel load_model(const std::string& dir, const DeviceOptions& options) {
  check_device(options);
  LoadedModel loaded;
  loaded.device = options.device;
  std::unique_ptr<Model> model = Model::load(dir);
#ifdef TURBOKV_HAVE_CUDA
  if (options.device == "cuda") {
    const auto* decoder = dynamic_cast<const DecoderModel*>(model.get());
    const std::string why =
        decoder != nullptr ? cuda::cuda_unsupported_reason(decoder->config()) : "";
    if (!why.empty()) {
      throw InvalidArgument(str_cat("--device cuda: ", why,
                                    " do not run on the GPU yet; use --device cpu"),
                            "device");
    }
  }
#endif
  if (options.device == "cpu") {
    loaded.model = std::move(model);
    const std::vector<LayerSpec> specs = loaded.model->layer_specs();
    loaded.make_caches = [specs](const ResolvedKV& kv) { return make_layer_caches(specs, kv); };
    return loaded;
  }
#ifdef TURBOKV_HAVE_CUDA
  auto* decoder = dynamic_cast<DecoderModel*>(model.get());
  if (decoder == nullptr) {
    throw Unsupported(str_cat("--device cuda: the ", model->info().model_type,
                              " model has no GPU forward"));
  }
  model.release();
  cuda::CudaModelOptions cuda_options;
  cuda_options.kv_cache_bytes = size_t(options.kv_cache_gb * double(1ull << 30));
  cuda_options.batch_invariant = options.batch_invariant;
  auto gpu = std::make_unique<cuda::CudaDecoderModel>(std::unique_ptr<DecoderModel>(decoder),
                                                      cuda_options);
  const cuda::CudaDecoderModel* g = gpu.get();
  loaded.make_caches = [g](const ResolvedKV& kv) { return g->make_caches(kv); };
  loaded.admission.bytes_for = [g](const ResolvedKV& kv, int64_t tokens) {
    return g->kv_bytes_for(kv, tokens);
  };
  loaded.admission.reserve = [g](size_t bytes) {
    return g->cache_context().pool().reserve(bytes);
  };
  loaded.admission.release = [g](size_t bytes) { g->cache_context().pool().unreserve(bytes); };
  loaded.admission.use = [g] {
    const cuda::PoolStats st = g->cache_context().pool().stats();
    KVPoolUse u;
    u.capacity_bytes = st.capacity_bytes;
    u.used_bytes = st.used_bytes;
    u.reserved_bytes = st.reserved_bytes;
    u.promisable_bytes = st.promisable_bytes;
    u.blocks = st.blocks_in_use;
    return u;
  };
  loaded.prefix_block = int(cuda::kBlockTokens);
  loaded.model = std::move(gpu);
#endif
  return loaded;
}

}  // namespace turbokv
