// Helpers shared by the model tests: fixture paths and exact (f32) KV caches for golden runs.
#pragma once

#include <string>

#include "kv/cache_policy.h"
#include "model/model.h"

namespace turbokv::testing {

inline std::string fixture(const std::string& rel) {
  return std::string(TURBOKV_SOURCE_DIR) + "/tests/fixtures/" + rel;
}
inline std::string repo_path(const std::string& rel) {
  return std::string(TURBOKV_SOURCE_DIR) + "/" + rel;
}

// Dense f32 caches (rotating ones for sliding layers) from the cache policy: exact K/V.
inline LayerCaches f32_caches(const Model& model) {
  return make_layer_caches(model.layer_specs(), ResolvedKV{}, KVDType::kF32);
}

}  // namespace turbokv::testing
