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
//
// TurboQuant levers; every one can be switched off, all off is plain TurboQuant (defaults:
// docs/benchmarks.md, "KV quality levers and the Pareto frontier"):
//  - kv_centering (default "none"): per-head means subtracted before coding
//    (kv/turboquant_kv_cache.h): "keys", "values" or "both". Off by default: the means are
//    estimated on a sequence's first chunk, which a prefix cache or session must then share;
//  - kv_sink_tokens (default 0): the first positions of a sequence stored in fp16;
//  - kv_recent_tokens (default 0): each query reads its last W positions as fp16 rows and the
//    codes before them (kv/turboquant_kv_cache.h); W > 1 keeps W - 1 fp16 rows per sequence,
//    and such a cache cannot be trimmed or shared as a prefix;
//  - kv_allocation: "keys" (the default when kv_bits is fractional and neither kv_key_bits nor
//    kv_value_bits is given) gives every TurboQuant layer but layer 0 keys ceil(kv_bits) and
//    values floor(kv_bits); layer 0 keeps keys floor, values ceil (same bytes). "none" (the
//    default otherwise): the mlx-vlm split in every layer. "auto": per-layer bits measured on a
//    sequence's first chunk under a budget (kv/kv_allocation.h; kv_budget, default the plain
//    setting's bits; perplexity only);
//  - kv_layer_bits: explicit per-layer bits or dense layers (boundary layers), applied last;
//  - kv_unbiased_norm (default off): each vector's stored norm is n / <y, C[idx]> instead of the
//    norm correction's n / ||C[idx]||, so that inner products with the decoded vector are
//    unbiased (quant/codec_mse.h step 5); the codes and the decoder are unchanged.
// The uniform scheme takes kv_hadamard and kv_layer_bits only.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "turbokv/kv_options.h"

namespace turbokv {

// Throws InvalidArgument naming the bad value and what is allowed; its param() is the field
// ("kv_bits", "kv_key_bits", "kv_value_bits", "kv_quant_scheme", "kv_group_size",
// "quantized_kv_start", "kv_centering", "kv_sink_tokens", "kv_recent_tokens", "kv_allocation",
// "kv_budget", "kv_layer_bits", "kv_hadamard", "kv_unbiased_norm").
ResolvedKV resolve_kv_options(const KVOptions& options);

// Parses a user-written bit width ("3.5", "4"); throws InvalidArgument (param = what) for "abc",
// "", "3.5x".
double parse_kv_bits(const std::string& text, const char* what = "kv_bits");

// The kv_layer_bits text of overrides ("0:3/5,-1:dense"), what the parser reads back.
std::string layer_bits_text(const std::vector<LayerKVBits>& bits);

// The KV options as the Python keywords and the HTTP request fields name them (the CLI's KV
// flags with underscores), and those of them that act on a quantized cache only: a front end
// refuses one of these, when a call gives it, if the call's cache is dense.
std::span<const char* const> kv_field_names();
std::span<const char* const> kv_lever_names();

}  // namespace turbokv
