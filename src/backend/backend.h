// Where a model runs: the one place that turns a device name into a model and the factory of
// its KV caches (the engine, `turbokv perplexity` and `bench` all load through it).
//   "cpu"   DecoderModel, caches from make_layer_caches
//   "cuda"  CudaDecoderModel (model/cuda), caches in GPU memory from the same plan
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kv/cache_policy.h"
#include "model/model.h"
#include "turbokv/engine.h"

namespace turbokv {

struct DeviceOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  double kv_cache_gb = 0;      // cuda: GPU memory for the KV cache pool; 0: 90% of what is free
  bool batch_invariant = false;  // cuda: CudaModelOptions::batch_invariant
};

// Admission by KV memory, for backends whose caches draw on one bounded pool (the GPU's): the
// engine thread promises a request the bytes its caches can take before it starts, and queues
// it while the pool cannot promise them. Empty functions: no such pool (the CPU).
struct KVAdmission {
  // The most bytes a sequence's caches of kv take at `tokens` tokens.
  std::function<size_t(const ResolvedKV& kv, int64_t tokens)> bytes_for;
  std::function<bool(size_t bytes)> reserve;  // false (nothing promised): not now
  std::function<void(size_t bytes)> release;
  // The pool now: capacity, bytes in blocks, bytes promised, blocks in use.
  std::function<KVPoolUse()> use;
  explicit operator bool() const { return bool(bytes_for); }
};

struct LoadedModel {
  std::unique_ptr<Model> model;
  CacheFactory make_caches;  // valid while model lives
  KVAdmission admission;     // valid while model lives
  std::string device;
  int prefix_block = 64;  // the prefix cache block that suits these caches
};

// Throws InvalidArgument for an unknown device, for "cuda" in a build without CUDA or on a
// machine without a usable GPU (naming the reason), and what Model::load throws.
LoadedModel load_model(const std::string& dir, const DeviceOptions& options);

// Throws InvalidArgument unless options name a device this build and machine can run.
void check_device(const DeviceOptions& options);

}  // namespace turbokv
