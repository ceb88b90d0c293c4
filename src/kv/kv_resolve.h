// The one place where user-facing KV options (include/turbokv/kv_options.h) become the choice
// the cache policy acts on. The engine resolves each request once; front ends call these only
// to turn user text into numbers.
//
// Rules (mlx-vlm's contract):
//  - no bits at all -> dense cache;
//  - kv_quant_scheme "turboquant" or any fractional bits -> TurboQuant, keys floor(kv_bits),
//    values ceil(kv_bits), kv_key_bits / kv_value_bits override each (k + 0.5 -> split codec);
//    valid: multiples of 0.5 in [1, 8];
//  - otherwise integer bits 2..8 -> uniform affine groups of kv_group_size (32, 64, 128).
#pragma once

#include <string>

#include "turbokv/kv_options.h"

namespace turbokv {

// Throws InvalidArgument naming the bad value and what is allowed; its param() is the field
// ("kv_bits", "kv_key_bits", "kv_value_bits", "kv_quant_scheme", "kv_group_size",
// "quantized_kv_start").
ResolvedKV resolve_kv_options(const KVOptions& options);

// Parses a user-written bit width ("3.5", "4"); throws InvalidArgument (param = what) for "abc",
// "", "3.5x".
double parse_kv_bits(const std::string& text, const char* what = "kv_bits");

}  // namespace turbokv
