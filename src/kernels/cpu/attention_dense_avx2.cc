// Dense attention, AVX2 path (entered only after cpu_has_avx2(), head_dim % 8 == 0).
#include "kernels/cpu/attention_entry.h"
#include "kernels/cpu/attention_isa_avx2.h"

namespace turbokv::attention_detail {

void attention_dense_avx2(const DenseKVView& kv, const AttentionQueries& queries,
                          const AttentionParams& params, float* out, float* lse) {
  attention_dense_on<Avx2Isa>(kv, queries, params, out, lse);
}

}  // namespace turbokv::attention_detail
