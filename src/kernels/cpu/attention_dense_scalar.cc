// Dense attention, portable path, and the ISA dispatch of attention_dense().
#include "core/cpu.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_entry.h"
#include "kernels/cpu/attention_isa_scalar.h"

namespace turbokv {

AttentionIsa best_attention_isa() {
  if (cpu_has_avx512()) return AttentionIsa::kAvx512;
  return cpu_has_avx2() ? AttentionIsa::kAvx2 : AttentionIsa::kScalar;
}

const char* attention_isa_name(AttentionIsa isa) {
  switch (isa) {
    case AttentionIsa::kScalar:
      return "scalar";
    case AttentionIsa::kAvx2:
      return "avx2";
    case AttentionIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

namespace attention_detail {
void attention_dense_scalar(const DenseKVView& kv, const AttentionQueries& queries,
                            const AttentionParams& params, float* out, float* lse) {
  attention_dense_on<ScalarIsa>(kv, queries, params, out, lse);
}
}  // namespace attention_detail

void attention_dense(const DenseKVView& kv, const AttentionQueries& queries,
                     const AttentionParams& params, float* out, AttentionIsa isa, float* lse) {
  if (isa != AttentionIsa::kScalar && cpu_has_avx2() && kv.head_dim % 8 == 0) {
    attention_detail::attention_dense_avx2(kv, queries, params, out, lse);
  } else {
    attention_detail::attention_dense_scalar(kv, queries, params, out, lse);
  }
}

}  // namespace turbokv
