// resolve_kv_options and parse_kv_bits (kv/kv_resolve.h).
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <sstream>
#include <string_view>

#include "core/error.h"
#include "kv/kv_resolve.h"
#include "quant/codec.h"

namespace turbokv {
namespace {

bool is_integer(double b) {
  return std::fabs(b - std::round(b)) < 1e-9;
}

void check_uniform_bits(double b, const char* what) {
  if (!std::isfinite(b) || !is_integer(b) || b < 2 || b > 8) {
    throw InvalidArgument(str_cat(what, "=", b,
                                  " is not valid for the uniform scheme: allowed are integers "
                                  "2..8 (fractional values select TurboQuant)"),
                          what);
  }
}

// "L:K/V", "L:B" or "L:dense" items separated by commas (kv_options.h); bits checked per scheme.
std::vector<LayerKVBits> parse_layer_bits(const std::string& spec, KVScheme scheme) {
  std::vector<LayerKVBits> out;
  if (spec.empty()) return out;
  const auto bad = [&](const std::string& item, const std::string& why) {
    return InvalidArgument(str_cat("kv_layer_bits item '", item, "' ", why,
                                   "; allowed: comma-separated LAYER:K/V, LAYER:BITS or "
                                   "LAYER:dense, LAYER an index (negative counts from the end)"),
                           "kv_layer_bits");
  };
  std::stringstream items(spec);
  for (std::string item; std::getline(items, item, ',');) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos || colon == 0) throw bad(item, "has no LAYER:");
    char* end = nullptr;
    const long layer = std::strtol(item.c_str(), &end, 10);
    if (end != item.c_str() + colon || layer < -1024 || layer > 1023) {
      throw bad(item, "has no valid layer index");
    }
    LayerKVBits bits;
    bits.layer = int(layer);
    const std::string value = item.substr(colon + 1);
    if (value == "dense") {
      bits.dense = true;
    } else {
      const size_t slash = value.find('/');
      try {
        bits.key_bits = parse_kv_bits(value.substr(0, slash), "kv_layer_bits");
        bits.value_bits = slash == std::string::npos
                              ? bits.key_bits
                              : parse_kv_bits(value.substr(slash + 1), "kv_layer_bits");
        if (scheme == KVScheme::kTurboQuant) {
          quant::check_turboquant_bits(bits.key_bits, "kv_layer_bits");
          quant::check_turboquant_bits(bits.value_bits, "kv_layer_bits");
        } else {
          check_uniform_bits(bits.key_bits, "kv_layer_bits");
          check_uniform_bits(bits.value_bits, "kv_layer_bits");
        }
      } catch (const InvalidArgument& e) {
        throw bad(item, str_cat("has bad bits (", e.what(), ")"));
      }
    }
    out.push_back(bits);
  }
  return out;
}

// The TurboQuant levers of o into r (key_bits, value_bits already resolved), with the defaults
// of kv_resolve.h.
void resolve_turboquant_levers(const KVOptions& o, ResolvedKV& r) {
  if (o.kv_hadamard) {
    throw InvalidArgument("kv_hadamard applies to the uniform scheme (TurboQuant always rotates)",
                          "kv_hadamard");
  }
  const std::string centering = o.kv_centering.value_or("none");
  if (centering != "none" && centering != "keys" && centering != "values" && centering != "both") {
    throw InvalidArgument(str_cat("kv_centering='", centering,
                                  "' is unknown; allowed: 'none', 'keys', 'values', 'both'"),
                          "kv_centering");
  }
  if (o.kv_unbiased_norm && !o.norm_correction) {
    throw InvalidArgument(
        "kv_unbiased_norm replaces the norm correction's n/||c|| by n/<y, c>; it cannot be "
        "combined with the plain norm (no norm correction)",
        "kv_unbiased_norm");
  }
  r.unbiased_norm = o.kv_unbiased_norm;
  r.center_keys = centering == "keys" || centering == "both";
  r.center_values = centering == "values" || centering == "both";
  r.sink_tokens = o.kv_sink_tokens.value_or(0);
  if (r.sink_tokens < 0 || r.sink_tokens > 65536) {
    throw InvalidArgument(
        str_cat("kv_sink_tokens=", r.sink_tokens, " is out of range (allowed 0..65536)"),
        "kv_sink_tokens");
  }
  r.recent_tokens = o.kv_recent_tokens.value_or(0);
  if (r.recent_tokens < 0 || r.recent_tokens > 1024) {
    throw InvalidArgument(
        str_cat("kv_recent_tokens=", r.recent_tokens, " is out of range (allowed 0..1024)"),
        "kv_recent_tokens");
  }
  const bool mlx_split = o.kv_bits && !is_integer(*o.kv_bits) && !o.kv_key_bits && !o.kv_value_bits;
  const std::string allocation = o.kv_allocation.value_or(mlx_split ? "keys" : "none");
  if (allocation == "none") {
    r.allocation = KVAllocation::kNone;
  } else if (allocation == "keys") {
    r.allocation = KVAllocation::kKeys;
  } else if (allocation == "auto") {
    r.allocation = KVAllocation::kAuto;
  } else {
    throw InvalidArgument(
        str_cat("kv_allocation='", allocation, "' is unknown; allowed: 'none', 'keys', 'auto'"),
        "kv_allocation");
  }
  if (o.kv_budget) {
    if (r.allocation != KVAllocation::kAuto || !(*o.kv_budget >= 1 && *o.kv_budget <= 16)) {
      throw InvalidArgument(str_cat("kv_budget=", *o.kv_budget,
                                    " needs kv_allocation 'auto' and a value in [1, 16] bits "
                                    "per element"),
                            "kv_budget");
    }
    r.budget_bits = *o.kv_budget;
  }
  r.layer_bits = parse_layer_bits(o.kv_layer_bits, r.scheme);
}

}  // namespace

const char* kv_allocation_name(KVAllocation allocation) {
  switch (allocation) {
    case KVAllocation::kNone:
      return "none";
    case KVAllocation::kKeys:
      return "keys";
    case KVAllocation::kAuto:
      return "auto";
  }
  return "?";
}

const char* kv_scheme_name(KVScheme scheme) {
  switch (scheme) {
    case KVScheme::kDense:
      return "dense";
    case KVScheme::kUniform:
      return "uniform";
    case KVScheme::kTurboQuant:
      return "turboquant";
  }
  return "?";
}

double parse_kv_bits(const std::string& text, const char* what) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (text.empty() || end == begin || *end != '\0' || !std::isfinite(v)) {
    throw InvalidArgument(str_cat(what, "='", text, "' is not a number; allowed are multiples of ",
                                  "0.5 in [1, 8] for TurboQuant or integers 2..8 for uniform"),
                          what);
  }
  return v;
}

std::string layer_bits_text(const std::vector<LayerKVBits>& bits) {
  std::string text;
  for (const LayerKVBits& b : bits) {
    if (!text.empty()) text += ",";
    text +=
        b.dense ? str_cat(b.layer, ":dense") : str_cat(b.layer, ":", b.key_bits, "/", b.value_bits);
  }
  return text;
}

namespace {
// The option names; the levers (kv_lever_names) are the last kLevers.
constexpr const char* kKVFieldNames[] = {
    "kv_bits",          "kv_quant_scheme",        "kv_key_bits",  "kv_value_bits",
    "kv_group_size",    "quantized_kv_start",     "kv_seed",      "kv_norm_correction",
    "kv_unbiased_norm", "kv_quantize_last_layer", "kv_centering", "kv_sink_tokens",
    "kv_recent_tokens", "kv_allocation",          "kv_budget",    "kv_layer_bits",
    "kv_hadamard"};
constexpr size_t kLevers = 10;
static_assert(std::string_view(kKVFieldNames[std::size(kKVFieldNames) - kLevers]) ==
              "kv_norm_correction");
}  // namespace

std::span<const char* const> kv_field_names() {
  return kKVFieldNames;
}

std::span<const char* const> kv_lever_names() {
  return kv_field_names().last(kLevers);
}

ResolvedKV resolve_kv_options(const KVOptions& o) {
  if (o.kv_quant_scheme != "uniform" && o.kv_quant_scheme != "turboquant") {
    throw InvalidArgument(str_cat("kv_quant_scheme='", o.kv_quant_scheme,
                                  "' is unknown; allowed: 'uniform', 'turboquant'"),
                          "kv_quant_scheme");
  }
  if (o.quantized_kv_start < 0) {
    throw InvalidArgument(str_cat("quantized_kv_start=", o.quantized_kv_start, " must be >= 0"),
                          "quantized_kv_start");
  }
  ResolvedKV r;
  r.seed = o.seed;
  r.norm_correction = o.norm_correction;
  r.last_layer_dense = o.last_layer_dense;
  r.quantized_kv_start = o.quantized_kv_start;
  r.group_size = o.kv_group_size;
  if (!o.kv_bits && !o.kv_key_bits && !o.kv_value_bits) return r;  // dense

  const bool fractional = (o.kv_bits && !is_integer(*o.kv_bits)) ||
                          (o.kv_key_bits && !is_integer(*o.kv_key_bits)) ||
                          (o.kv_value_bits && !is_integer(*o.kv_value_bits));
  if (o.kv_quant_scheme == "turboquant" || fractional) {
    r.scheme = KVScheme::kTurboQuant;
    if (o.kv_bits) {
      quant::check_turboquant_bits(*o.kv_bits, "kv_bits");
      r.key_bits = std::floor(*o.kv_bits);
      r.value_bits = std::ceil(*o.kv_bits);
    } else {
      r.key_bits = r.value_bits = o.kv_key_bits ? *o.kv_key_bits : *o.kv_value_bits;
    }
    if (o.kv_key_bits) r.key_bits = *o.kv_key_bits;
    if (o.kv_value_bits) r.value_bits = *o.kv_value_bits;
    quant::check_turboquant_bits(r.key_bits, "kv_key_bits");
    quant::check_turboquant_bits(r.value_bits, "kv_value_bits");
    resolve_turboquant_levers(o, r);
    return r;
  }
  r.scheme = KVScheme::kUniform;
  const char* field = o.kv_bits ? "kv_bits" : (o.kv_key_bits ? "kv_key_bits" : "kv_value_bits");
  const double bits = o.kv_bits ? *o.kv_bits : (o.kv_key_bits ? *o.kv_key_bits : *o.kv_value_bits);
  check_uniform_bits(bits, field);
  r.key_bits = o.kv_key_bits ? *o.kv_key_bits : bits;
  r.value_bits = o.kv_value_bits ? *o.kv_value_bits : bits;
  check_uniform_bits(r.key_bits, "kv_key_bits");
  check_uniform_bits(r.value_bits, "kv_value_bits");
  if (o.kv_group_size != 32 && o.kv_group_size != 64 && o.kv_group_size != 128) {
    throw InvalidArgument(
        str_cat("kv_group_size=", o.kv_group_size, " is not supported; allowed: 32, 64, 128"),
        "kv_group_size");
  }
  for (auto [given, name] : {std::pair{o.kv_centering.has_value(), "kv_centering"},
                             std::pair{o.kv_sink_tokens.has_value(), "kv_sink_tokens"},
                             std::pair{o.kv_recent_tokens.has_value(), "kv_recent_tokens"},
                             std::pair{o.kv_allocation.has_value(), "kv_allocation"},
                             std::pair{o.kv_budget.has_value(), "kv_budget"},
                             std::pair{o.kv_unbiased_norm, "kv_unbiased_norm"}}) {
    if (given) {
      throw InvalidArgument(str_cat(name, " applies to the TurboQuant scheme, not to uniform"),
                            name);
    }
  }
  r.hadamard = o.kv_hadamard;
  r.layer_bits = parse_layer_bits(o.kv_layer_bits, r.scheme);
  return r;
}

}  // namespace turbokv
