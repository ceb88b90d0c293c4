// Attention on TurboQuant and uniform codes, portable path (decodes through the codecs' own
// decode_rotated / dequantize), and the ISA dispatch of attention_turboquant / _uniform.
#include <atomic>

#include "core/cpu.h"
#include "kernels/cpu/attention_codes_core.h"
#include "kernels/cpu/attention_entry.h"
#include "kernels/cpu/attention_isa_scalar.h"
#include "kernels/cpu/qweights.h"

namespace turbokv {
namespace attention_detail {
namespace {

struct UniformDecoder {
  static void decode(const quant::UniformCodec& codec, const uint8_t* codes, const uint16_t* params,
                     float* out) {
    codec.dequantize(codes, params, out);
  }
};

}  // namespace

void attention_uniform_scalar(const UniformKVView& kv, const AttentionQueries& queries,
                              const AttentionParams& params, float* out, float* lse) {
  attention_uniform_on<ScalarIsa, UniformDecoder>(kv, queries, params, out, lse);
}

void attention_turboquant_scalar(const TurboQuantKVView& kv, const AttentionQueries& queries,
                                 const AttentionParams& params, float* out, float* lse) {
  attention_turboquant_on<ScalarIsa, CodecDecoder>(kv, queries, params, out, lse,
                                                   quant::Isa::kScalar);
}

}  // namespace attention_detail

namespace {

std::atomic<CodeProducts>& code_products_setting() {
  static std::atomic<CodeProducts> setting{
      env_flag("TURBOKV_EXACT_ATTENTION") || f32_reference_mode() ? CodeProducts::kExact
                                                                  : CodeProducts::kInt8};
  return setting;
}

}  // namespace

CodeProducts code_products() { return code_products_setting().load(std::memory_order_relaxed); }

void set_code_products(CodeProducts products) {
  code_products_setting().store(products, std::memory_order_relaxed);
}

void attention_turboquant(const TurboQuantKVView& kv, const AttentionQueries& queries,
                          const AttentionParams& params, float* out, AttentionIsa isa, float* lse) {
  // The AVX-512 decode kernel's 8-bit products use VNNI; without it AVX2's path is the faster.
  static const bool vnni = cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
  if (isa == AttentionIsa::kAvx512 && vnni && kv.head_dim % 8 == 0) {
    attention_detail::attention_turboquant_avx512(kv, queries, params, out, lse);
  } else if (isa != AttentionIsa::kScalar && cpu_has_avx2() && kv.head_dim % 8 == 0) {
    attention_detail::attention_turboquant_avx2(kv, queries, params, out, lse);
  } else {
    attention_detail::attention_turboquant_scalar(kv, queries, params, out, lse);
  }
}

void attention_uniform(const UniformKVView& kv, const AttentionQueries& queries,
                       const AttentionParams& params, float* out, AttentionIsa isa, float* lse) {
  if (isa != AttentionIsa::kScalar && cpu_has_avx2() && kv.head_dim % 8 == 0) {
    attention_detail::attention_uniform_avx2(kv, queries, params, out, lse);
  } else {
    attention_detail::attention_uniform_scalar(kv, queries, params, out, lse);
  }
}

}  // namespace turbokv
