// Per-ISA entry points of the fast attention kernels (external linkage). Each is defined in
// the translation unit of its ISA (attention_*_scalar.cc, _avx2.cc, _avx512.cc); the public
// functions in attention.h / attention_codes.h pick one at run time.
#pragma once

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_codes.h"

namespace turbokv::attention_detail {

void attention_dense_scalar(const DenseKVView& kv, const AttentionQueries& queries,
                            const AttentionParams& params, float* out, float* lse);
void attention_dense_avx2(const DenseKVView& kv, const AttentionQueries& queries,
                          const AttentionParams& params, float* out, float* lse);
void attention_turboquant_scalar(const TurboQuantKVView& kv, const AttentionQueries& queries,
                                 const AttentionParams& params, float* out, float* lse);
void attention_turboquant_avx2(const TurboQuantKVView& kv, const AttentionQueries& queries,
                               const AttentionParams& params, float* out, float* lse);
// Decode on TurboQuant codes with AVX-512VL codebook lookups (attention_codes_avx512.cc);
// prefill and codecs its decode kernel does not take go to attention_turboquant_avx2.
void attention_turboquant_avx512(const TurboQuantKVView& kv, const AttentionQueries& queries,
                                 const AttentionParams& params, float* out, float* lse);
void attention_uniform_scalar(const UniformKVView& kv, const AttentionQueries& queries,
                              const AttentionParams& params, float* out, float* lse);
void attention_uniform_avx2(const UniformKVView& kv, const AttentionQueries& queries,
                            const AttentionParams& params, float* out, float* lse);

}  // namespace turbokv::attention_detail
