// resolve_kv_options and parse_kv_bits (kv/kv_resolve.h).
#include <cmath>
#include <cstdlib>

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

}  // namespace

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
  return r;
}

}  // namespace turbokv
