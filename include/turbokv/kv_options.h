// KV-cache options as users give them (mirrors mlx-vlm: kv_bits, kv_quant_scheme, ...) and
// the resolved choice the cache policy acts on. The selection rules (docs/design.md, "Choosing
// the KV scheme") are applied once per request by the engine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace turbokv {

enum class KVScheme { kDense, kUniform, kTurboQuant };
const char* kv_scheme_name(KVScheme scheme);  // "dense", "uniform", "turboquant"

struct KVOptions {
  std::optional<double> kv_bits;            // none -> dense cache
  std::string kv_quant_scheme = "uniform";  // "uniform" | "turboquant"
  std::optional<double> kv_key_bits;        // overrides the key bits (TurboQuant)
  std::optional<double> kv_value_bits;      // overrides the value bits (TurboQuant)
  int kv_group_size = 64;                   // uniform scheme: 32, 64 or 128
  int64_t quantized_kv_start = 0;           // stay dense until a layer holds this many tokens
  uint64_t seed = 0;                        // rotation / QJL seed
  bool norm_correction = true;              // TurboQuant: store n / ||c||
  bool last_layer_dense = true;             // keep the most sensitive layer exact
};

struct ResolvedKV {
  KVScheme scheme = KVScheme::kDense;
  double key_bits = 16;    // TurboQuant: multiple of 0.5 in [1, 8]; .5 selects the split codec
  double value_bits = 16;  // uniform: integer 2..8
  int group_size = 64;
  int64_t quantized_kv_start = 0;
  uint64_t seed = 0;
  bool norm_correction = true;
  bool last_layer_dense = true;

  bool operator==(const ResolvedKV&) const = default;
};

}  // namespace turbokv
