// Where a model runs: the one place that turns a device name into a model and the factory of
// its KV caches (the engine, `turbokv perplexity` and `bench` all load through it).
//   "cpu"   DecoderModel, caches from make_layer_caches
//   "cuda"  CudaDecoderModel (model/cuda), caches in GPU memory from the same plan
#pragma once

#include <memory>
#include <string>

#include "kv/cache_policy.h"
#include "model/model.h"

namespace turbokv {

struct DeviceOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  double kv_cache_gb = 0;      // cuda: GPU memory for the KV cache pool; 0: 90% of what is free
};

struct LoadedModel {
  std::unique_ptr<Model> model;
  CacheFactory make_caches;  // valid while model lives
  std::string device;
  int prefix_block = 64;  // the prefix cache block that suits these caches
};

// Throws InvalidArgument for an unknown device, for "cuda" in a build without CUDA or on a
// machine without a usable GPU (naming the reason), and what Model::load throws.
LoadedModel load_model(const std::string& dir, const DeviceOptions& options);

// Throws InvalidArgument unless options name a device this build and machine can run.
void check_device(const DeviceOptions& options);

}  // namespace turbokv
