// Attention on TurboQuant codes, AVX-512 path (F, BW, VL, DQ): the decode kernel of
// attention_codes_decode.h with 32 vector registers (more accumulators) and 16-entry
// codebooks looked up by one vpermi2ps. Prefill, and KV heads whose codecs the decode kernel
// does not take, run the AVX2 path.
#include "kernels/cpu/attention_codes_decode.h"
#include "kernels/cpu/attention_entry.h"

namespace turbokv::attention_detail {
namespace {

struct Avx512Lookup {
  static constexpr int kRegisters = 32;

  template <int B>
  static __m256 group(const uint8_t* p, const CodeTable& table) {
    const __m256i idx = group_indices(p, table.shifts);
    if constexpr (B < 4) return _mm256_permutevar8x32_ps(table.low, idx);
    return _mm256_permutex2var_ps(table.low, idx, table.high);  // index bit 3 picks high
  }
};

}  // namespace

void attention_turboquant_avx512(const TurboQuantKVView& kv, const AttentionQueries& queries,
                                 const AttentionParams& params, float* out, float* lse) {
  bool decode = queries.n_q == 1 && kv.head_dim % 8 == 0;
  for (int h = 0; h < kv.kv_heads && decode; ++h) {
    decode = CodeDecodeKernel<Avx512Lookup>::eligible(make_vector_decoder(*kv.keys.codecs[h]),
                                                      make_vector_decoder(*kv.values.codecs[h]));
  }
  if (!decode) return attention_turboquant_avx2(kv, queries, params, out, lse);
  // Every item is a single query on an eligible head: the tile decoder is never used.
  attention_turboquant_on<Avx2Isa, CodecDecoder, CodeDecodeKernel<Avx512Lookup>>(
      kv, queries, params, out, lse, quant::Isa::kAvx2);
}

}  // namespace turbokv::attention_detail
