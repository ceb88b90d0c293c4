// KV-cache options as users give them (mirrors mlx-vlm: kv_bits, kv_quant_scheme, ...) and
// the resolved choice the cache policy acts on. The selection rules (docs/design.md, "Choosing
// the KV scheme") are applied once per request by the engine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
  // TurboQuant: store n / <y, c> instead (inner products with the codes unbiased; needs
  // norm_correction on)
  bool kv_unbiased_norm = false;
  bool last_layer_dense = true;  // keep the most sensitive layer exact
  // TurboQuant levers (kv/turboquant_kv_cache.h, kv/kv_allocation.h); unset -> the defaults
  // of resolve_kv_options (kv/kv_resolve.h).
  std::optional<std::string> kv_centering;  // "none" | "keys" | "values" | "both"
  std::optional<int> kv_sink_tokens;        // first positions kept fp16, 0..65536
  std::optional<int> kv_recent_tokens;      // each query's last positions read as fp16, 0..1024
  // "none" | "keys" | "auto": how a fractional kv_bits is split between keys and values per
  // layer (kv/kv_resolve.h); kv_budget: bits per element "auto" spends.
  std::optional<std::string> kv_allocation;
  std::optional<double> kv_budget;
  // Per-layer overrides, "L:K/V" or "L:B" or "L:dense" separated by commas; L counts from the
  // end when negative (-1 is the last layer). E.g. "0:4/4,-1:dense" (boundary layers).
  std::string kv_layer_bits;
  bool kv_hadamard = false;  // uniform scheme: rotate by a randomized Hadamard before grouping
};

// One layer's bits when they differ from the request's (ResolvedKV::layer_bits).
struct LayerKVBits {
  int layer = 0;  // < 0 counts from the end
  bool dense = false;
  double key_bits = 0;
  double value_bits = 0;

  bool operator==(const LayerKVBits&) const = default;
};

enum class KVAllocation { kNone, kKeys, kAuto };
const char* kv_allocation_name(KVAllocation allocation);  // "none", "keys", "auto"

struct ResolvedKV {
  KVScheme scheme = KVScheme::kDense;
  double key_bits = 16;    // TurboQuant: multiple of 0.5 in [1, 8]; .5 selects the split codec
  double value_bits = 16;  // uniform: integer 2..8
  int group_size = 64;
  int64_t quantized_kv_start = 0;
  uint64_t seed = 0;
  bool norm_correction = true;
  bool unbiased_norm = false;  // TurboQuant: stored norms n / <y, c> (quant/codec_mse.h)
  bool last_layer_dense = true;
  bool center_keys = false;  // TurboQuant
  bool center_values = false;
  int sink_tokens = 0;
  int recent_tokens = 0;
  KVAllocation allocation = KVAllocation::kNone;
  double budget_bits = 0;               // kAuto: bits per element to spend; 0: the plain setting's
  std::vector<LayerKVBits> layer_bits;  // overrides, later entries win
  bool hadamard = false;                // uniform

  bool operator==(const ResolvedKV&) const = default;
};

}  // namespace turbokv
