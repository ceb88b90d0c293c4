// merge_attention_partials (attention.h): the log-sum-exp merge of two attentions over
// disjoint key sets, row by row.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/attention.h"

namespace turbokv {

void merge_attention_partials(const float* out_a, const float* lse_a, const float* out_b,
                              const float* lse_b, int64_t rows, int head_dim, float* out,
                              float* lse) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const float la = lse_a[r], lb = lse_b[r];
    const float m = std::max(la, lb);
    const int64_t base = r * head_dim;
    if (m == neg_inf) {  // neither side saw a key
      std::fill(out + base, out + base + head_dim, 0.0f);
      if (lse != nullptr) lse[r] = neg_inf;
      continue;
    }
    if (la == neg_inf || lb == neg_inf) {  // one side saw no key: the other one as it is
      const float* only = la == neg_inf ? out_b : out_a;
      for (int c = 0; c < head_dim; ++c) out[base + c] = only[base + c];
      if (lse != nullptr) lse[r] = m;
      continue;
    }
    // Shifted by the larger statistic: one exponential is 1, the other in (0, 1].
    const float ea = std::exp(la - m), eb = std::exp(lb - m);
    const float total = ea + eb;
    const float wa = ea / total, wb = eb / total;
    for (int c = 0; c < head_dim; ++c) out[base + c] = wa * out_a[base + c] + wb * out_b[base + c];
    if (lse != nullptr) lse[r] = m + std::log(total);
  }
}

}  // namespace turbokv
