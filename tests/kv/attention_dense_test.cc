// Fast dense attention (scalar and AVX2, every dtype) against the reference on the shared cases,
// with the softmax statistics; merge_attention_partials of partials over disjoint keys.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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
      auto expected_lse = testing::lse_buffer(c);
      attention_reference(view, queries, c.params(), expected.data(), expected_lse.data());
      for (AttentionIsa isa : {AttentionIsa::kScalar, AttentionIsa::kAvx2}) {
        auto got = testing::output_buffer(c);
        auto got_lse = testing::lse_buffer(c);
        attention_dense(view, queries, c.params(), got.data(), isa, got_lse.data());
        const std::string name =
            std::string(isa == AttentionIsa::kAvx2 ? "avx2 " : "scalar ") + kv_dtype_name(dtype);
        testing::expect_attention_close(c, expected, got, 1e-4, name);
        testing::expect_lse_close(c, expected_lse, got_lse, 1e-4, name);
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

// A view of tokens [first, first + n) of rows' KV (the same heads, positions kept).
DenseKVView token_range(DenseKVView view, int64_t first, int64_t n) {
  const size_t offset = size_t(first) * view.head_dim * kv_dtype_bytes(view.dtype);
  view.k = static_cast<const char*>(view.k) + offset;
  view.v = static_cast<const char*>(view.v) + offset;
  view.n_tokens = n;
  view.first_pos += first;
  return view;
}

TEST(AttentionMerge, PartialsOverDisjointKeysMergeToTheWhole) {
  // Split points inside and at the edges of the keys, a chunk whose first queries see none of
  // the second part (lse -inf there), a window that hides the first part from late queries.
  struct Split {
    testing::AttentionCase c;
    int64_t first_part;
  };
  const Split splits[] = {{{128, 2, 4, 600, 1}, 4}, {{128, 2, 4, 600, 1}, 300},
                          {{64, 2, 2, 40, 24}, 50}, {{64, 1, 4, 20, 30, 16}, 8},
                          {{96, 2, 1, 0, 1}, 1},    {{64, 2, 8, 100, 1, 0, 30.0f}, 64}};
  uint32_t seed = 40;
  for (const auto& [c, first_part] : splits) {
    const auto in = testing::make_inputs(c, seed++);
    for (KVDType dtype : {KVDType::kF32, KVDType::kF16}) {
      DenseRows rows(dtype, c.kv_heads, c.head_dim);
      rows.append(in.k.data(), in.v.data(), c.n_tokens());
      const DenseKVView all = rows.view(0);
      const AttentionQueries queries{in.q.data(), c.n_q, c.n_past};
      auto expected = testing::output_buffer(c);
      auto expected_lse = testing::lse_buffer(c);
      attention_reference(all, queries, c.params(), expected.data(), expected_lse.data());
      for (AttentionIsa isa : {AttentionIsa::kScalar, AttentionIsa::kAvx2}) {
        auto a = testing::output_buffer(c), b = testing::output_buffer(c);
        auto lse_a = testing::lse_buffer(c), lse_b = testing::lse_buffer(c);
        attention_dense(token_range(all, 0, first_part), queries, c.params(), a.data(), isa,
                        lse_a.data());
        attention_dense(token_range(all, first_part, c.n_tokens() - first_part), queries,
                        c.params(), b.data(), isa, lse_b.data());
        const int64_t rows_out = int64_t(c.n_q) * c.n_heads();
        // In place into a, as a caller merging into its output buffer would.
        merge_attention_partials(a.data(), lse_a.data(), b.data(), lse_b.data(), rows_out,
                                 c.head_dim, a.data(), lse_a.data());
        const std::string name = std::string("merged ") + kv_dtype_name(dtype) +
                                 (isa == AttentionIsa::kAvx2 ? " avx2" : " scalar") + " at " +
                                 std::to_string(first_part);
        testing::expect_attention_close(c, expected, a, 1e-4, name);
        testing::expect_lse_close(c, expected_lse, lse_a, 1e-4, name);
      }
    }
  }
}

TEST(AttentionMerge, RowsWithoutKeysAndExactCases) {
  const float inf = std::numeric_limits<float>::infinity();
  const int d = 3;
  // Rows: both sides, only a, only b, neither, equal statistics, one side far smaller.
  const std::vector<float> out_a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 1, 1, 2, 2, 2};
  const std::vector<float> out_b = {-1, 0, 1, 0, 0, 0, 3, 2, 1, 0, 0, 0, 3, 3, 3, 4, 4, 4};
  const std::vector<float> lse_a = {0.5f, 1.0f, -inf, -inf, 2.0f, 0.0f};
  const std::vector<float> lse_b = {1.5f, -inf, 3.0f, -inf, 2.0f, -200.0f};
  std::vector<float> out(out_a.size()), lse(lse_a.size());
  merge_attention_partials(out_a.data(), lse_a.data(), out_b.data(), lse_b.data(), 6, d, out.data(),
                           lse.data());
  // Row 0 by hand: weights e^0.5 : e^1.5, lse = log(e^0.5 + e^1.5).
  const double wa = std::exp(0.5) / (std::exp(0.5) + std::exp(1.5));
  for (int c = 0; c < d; ++c) EXPECT_NEAR(out[c], wa * out_a[c] + (1 - wa) * out_b[c], 1e-6);
  EXPECT_NEAR(lse[0], std::log(std::exp(0.5) + std::exp(1.5)), 1e-6);
  for (int c = 0; c < d; ++c) {
    EXPECT_EQ(out[d + c], out_a[d + c]);          // b saw nothing: a exactly
    EXPECT_EQ(out[2 * d + c], out_b[2 * d + c]);  // a saw nothing: b exactly
    EXPECT_EQ(out[3 * d + c], 0.0f);              // neither: zero row
    EXPECT_NEAR(out[4 * d + c], 0.5 * (out_a[4 * d + c] + out_b[4 * d + c]), 1e-6);
    EXPECT_NEAR(out[5 * d + c], out_a[5 * d + c], 1e-6);
  }
  EXPECT_EQ(lse[1], 1.0f);
  EXPECT_EQ(lse[2], 3.0f);
  EXPECT_EQ(lse[3], -inf);
  EXPECT_NEAR(lse[4], 2.0 + std::log(2.0), 1e-6);
  EXPECT_NEAR(lse[5], 0.0, 1e-6);
  // Null lse output, and b merged in place.
  std::vector<float> in_place = out_b;
  merge_attention_partials(out_a.data(), lse_a.data(), in_place.data(), lse_b.data(), 6, d,
                           in_place.data(), nullptr);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(in_place[i], out[i]) << i;
}

}  // namespace
}  // namespace turbokv
