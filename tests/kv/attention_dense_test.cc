// Fast dense attention (scalar and AVX2, every dtype) against the reference on the shared cases.
#include <gtest/gtest.h>

#include "attention_harness.h"
#include "core/half.h"
#include "kv/dense_rows.h"

namespace turbokv {
namespace {

using testing::AttentionCase;

TEST(DenseAttention, EveryIsaAndDtypeMatchesReference) {
  uint32_t seed = 1;
  for (const AttentionCase& c : testing::attention_cases()) {
    const auto in = testing::make_inputs(c, seed++);
    for (KVDType dtype : {KVDType::kF32, KVDType::kF16, KVDType::kBF16}) {
      DenseRows rows(dtype, c.kv_heads, c.head_dim);
      rows.append(in.k.data(), in.v.data(), c.n_tokens());
      const DenseKVView view = rows.view(0);
      const AttentionQueries queries{in.q.data(), c.n_q, c.n_past};
      auto expected = testing::output_buffer(c);
      attention_reference(view, queries, c.params(), expected.data());
      for (AttentionIsa isa : {AttentionIsa::kScalar, AttentionIsa::kAvx2}) {
        auto got = testing::output_buffer(c);
        attention_dense(view, queries, c.params(), got.data(), isa);
        testing::expect_attention_close(
            c, expected, got, 1e-4,
            std::string(isa == AttentionIsa::kAvx2 ? "avx2 " : "scalar ") + kv_dtype_name(dtype));
      }
    }
  }
}

TEST(DenseAttention, ViewWithOffsetPositionsMatchesReference) {
  // A rotating cache's view starts at a position > 0; masks use absolute positions.
  const AttentionCase c{64, 2, 4, 100, 20, 37};
  const auto in = testing::make_inputs(c, 99);
  DenseRows rows(KVDType::kF32, c.kv_heads, c.head_dim);
  rows.append(in.k.data(), in.v.data(), c.n_tokens());
  const DenseKVView view = rows.view(5000);
  const AttentionQueries queries{in.q.data(), c.n_q, 5000 + c.n_past};
  auto expected = testing::output_buffer(c);
  auto got = testing::output_buffer(c);
  attention_reference(view, queries, c.params(), expected.data());
  attention_dense(view, queries, c.params(), got.data());
  testing::expect_attention_close(c, expected, got, 1e-4, "offset");
}

}  // namespace
}  // namespace turbokv
