// TurboQuantKVCache recent tokens (recent_tokens = W): a query at position p reads positions
// max(S, p - W + 1) .. p as fp16 rows and the codes only up to p - W. Checked against a
// reference built here from the rule itself: per query, a dense f32 cache whose rows are the
// fp16-rounded inputs inside the window and the sinks, and the dequantized codes of a cache
// without the window elsewhere (recent_tokens leaves every code as it is).
#include <gtest/gtest.h>

#include <cstring>

#include "attention_harness.h"
#include "core/error.h"
#include "core/half.h"
#include "kv/byte_io.h"
#include "kv/turboquant_kv_cache.h"

namespace turbokv {
namespace {

TurboQuantKVConfig recent_config(double key_bits, double value_bits, bool center, int sinks,
                                 int recent) {
  TurboQuantKVConfig c{key_bits, value_bits, 5, true};
  c.center_keys = center;
  c.center_values = center;
  c.sink_tokens = sinks;
  c.recent_tokens = recent;
  return c;
}

float f16_round(float x) {
  return f16_to_f32(f32_to_f16(x));
}

// The attention of queries [n_q] at positions first_pos.. under the window rule, one query at a
// time over the rows it may read.
std::vector<float> window_reference(const testing::AttentionCase& c,
                                    const testing::AttentionInputs& in, const DenseKVCache& codes,
                                    int sinks, int recent, int64_t first_pos, int n_q,
                                    const float* q) {
  const size_t row = size_t(c.kv_heads) * c.head_dim;
  const size_t q_row = size_t(c.n_heads()) * c.head_dim;
  std::vector<float> dk, dv;
  codes.copy_tokens(0, codes.size(), &dk, &dv);
  std::vector<float> out(n_q * q_row);
  for (int i = 0; i < n_q; ++i) {
    const int64_t p = first_pos + i;
    std::vector<float> k((p + 1) * row), v((p + 1) * row);
    for (int64_t j = 0; j <= p; ++j) {
      const bool exact = j < sinks || j > p - recent;
      for (size_t e = 0; e < row; ++e) {
        k[j * row + e] = exact ? f16_round(in.k[j * row + e]) : dk[j * row + e];
        v[j * row + e] = exact ? f16_round(in.v[j * row + e]) : dv[j * row + e];
      }
    }
    DenseKVCache dense(c.kv_heads, c.head_dim, KVDType::kF32);
    dense.append(k.data(), v.data(), static_cast<int>(p + 1));
    attention_reference(dense.view(), AttentionQueries{q + i * q_row, 1, p}, c.params(),
                        out.data() + i * q_row);
  }
  return out;
}

TEST(TurboQuantRecent, ChunkAttendsItsWindowInFp16) {
  const testing::ScopedCodeProducts exact(CodeProducts::kExact);
  const int recents[] = {1, 2, 5, 64};
  const int sinks[] = {0, 3};
  uint32_t seed = 900;
  size_t index = 0;
  for (const testing::AttentionCase& c : testing::attention_cases()) {
    if (c.head_dim < 4 || c.n_tokens() > 600) continue;
    const int recent = recents[index % std::size(recents)];
    const int sink = sinks[(index / std::size(recents)) % std::size(sinks)];
    const bool center = c.softcap == 0 && index % 3 != 0;
    const double key_bits = index % 2 == 0 ? 3 : 3.5;
    ++index;
    const auto in = testing::make_inputs(c, seed++);
    const size_t r = size_t(c.kv_heads) * c.head_dim;
    TurboQuantKVCache cache(c.kv_heads, c.head_dim,
                            recent_config(key_bits, 4, center, sink, recent));
    TurboQuantKVCache plain(c.kv_heads, c.head_dim, recent_config(key_bits, 4, center, sink, 0));
    for (TurboQuantKVCache* x : {&cache, &plain}) {
      if (c.n_past > 0) x->append(in.k.data(), in.v.data(), static_cast<int>(c.n_past));
      x->append(in.k.data() + c.n_past * r, in.v.data() + c.n_past * r, c.n_q);
    }
    const auto expected =
        window_reference(c, in, plain.to_dense(), sink, recent, c.n_past, c.n_q, in.q.data());
    auto got = testing::output_buffer(c);
    cache.attend(in.q.data(), c.n_q, c.params(), got.data());
    testing::expect_attention_close(
        c, expected, got, 2e-4,
        "recent " + std::to_string(recent) + " sinks " + std::to_string(sink));
    // Between steps the cache keeps the window's W - 1 last rows, fp16 of the inputs.
    const int64_t held = std::min<int64_t>(recent - 1, cache.coded_rows());
    ASSERT_EQ(cache.recent_rows(), held) << c.name();
    const DenseKVView view = cache.recent_view();
    ASSERT_EQ(view.first_pos, c.n_tokens() - held);
    const auto* keys = static_cast<const uint16_t*>(view.k);
    for (int64_t t = 0; t < held; ++t) {
      const int64_t pos = view.first_pos + t;
      for (int h = 0; h < c.kv_heads; ++h) {
        for (int j = 0; j < c.head_dim; ++j) {
          ASSERT_EQ(keys[(h * view.head_stride + t) * c.head_dim + j],
                    f32_to_f16(in.k[pos * r + size_t(h) * c.head_dim + j]));
        }
      }
    }
    EXPECT_EQ(cache.nbytes(), plain.nbytes() + size_t(held) * r * 4);
  }
}

// Decode one token at a time after a prefill: every step's query reads its own window; a saved
// and loaded cache goes on with the same bits.
TEST(TurboQuantRecent, DecodeStepsAndSaveLoad) {
  const testing::ScopedCodeProducts exact(CodeProducts::kExact);
  testing::AttentionCase c{64, 2, 2, 0, 1};
  const int prefill = 20, steps = 12, recent = 6, sinks = 2;
  c.n_past = prefill + steps - 1;
  const auto in = testing::make_inputs(c, 77);
  const auto q = testing::random_normal(size_t(steps) * c.n_heads() * c.head_dim, 78, 2.0f);
  const size_t r = size_t(c.kv_heads) * c.head_dim, q_row = size_t(c.n_heads()) * c.head_dim;
  const TurboQuantKVConfig config = recent_config(3, 3.5, true, sinks, recent);
  TurboQuantKVCache cache(c.kv_heads, c.head_dim, config);
  TurboQuantKVCache plain(c.kv_heads, c.head_dim, recent_config(3, 3.5, true, sinks, 0));
  for (TurboQuantKVCache* x : {&cache, &plain}) x->append(in.k.data(), in.v.data(), prefill);
  std::unique_ptr<TurboQuantKVCache> loaded;
  for (int s = 0; s < steps; ++s) {
    const int64_t pos = prefill + s;
    for (TurboQuantKVCache* x : {&cache, &plain, loaded.get()}) {
      if (x != nullptr) x->append(in.k.data() + pos * r, in.v.data() + pos * r, 1);
    }
    const float* qs = q.data() + s * q_row;
    const auto expected = window_reference(c, in, plain.to_dense(), sinks, recent, pos, 1, qs);
    std::vector<float> got(q_row), again(q_row);
    cache.attend(qs, 1, c.params(), got.data());
    for (size_t e = 0; e < q_row; ++e) {
      EXPECT_NEAR(got[e], expected[e], 2e-4 * (1 + std::abs(expected[e]))) << "step " << s;
    }
    if (loaded) {
      loaded->attend(qs, 1, c.params(), again.data());
      EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * 4), 0) << "step " << s;
    }
    if (s == 4) {  // save here, go on with both
      ByteWriter out;
      cache.save(out);
      loaded = std::make_unique<TurboQuantKVCache>(c.kv_heads, c.head_dim, config);
      ByteReader rd(out.buffer().data(), out.buffer().size());
      loaded->load(rd);
      EXPECT_EQ(rd.remaining(), 0u);
      EXPECT_EQ(loaded->recent_rows(), recent - 1);
      EXPECT_EQ(loaded->nbytes(), cache.nbytes());
    }
  }
}

// The window's fp16 rows exist only for the last positions: a shorter prefix cannot be copied
// or trimmed to (clear errors); W = 1 keeps nothing, so both still work there.
TEST(TurboQuantRecent, PrefixesNeedTheWindowRows) {
  const int kv_heads = 1, d = 32;
  const auto k = testing::random_normal(30 * size_t(d), 81);
  const auto v = testing::random_normal(30 * size_t(d), 82);
  TurboQuantKVCache cache(kv_heads, d, recent_config(3, 4, false, 0, 4));
  cache.append(k.data(), v.data(), 30);
  ByteWriter out;
  EXPECT_THROW(cache.write_rows(out, 0, 16), Unsupported);
  EXPECT_THROW(cache.trim(2), Unsupported);
  EXPECT_NO_THROW(cache.trim(0));
  EXPECT_NO_THROW(cache.copy_rows(0, 30));
  TurboQuantKVCache one(kv_heads, d, recent_config(3, 4, false, 0, 1));
  one.append(k.data(), v.data(), 30);
  EXPECT_NO_THROW(one.copy_rows(0, 16));
  EXPECT_NO_THROW(one.trim(5));
  EXPECT_EQ(one.size(), 25);
  EXPECT_THROW(TurboQuantKVCache(kv_heads, d, recent_config(3, 4, false, 0, kMaxRecentTokens + 1)),
               InvalidArgument);
  EXPECT_THROW(TurboQuantKVCache(kv_heads, d, recent_config(3, 4, false, 0, -1)), InvalidArgument);
}

// set_recent_rows (device caches' to_host) installs rows exactly; a wrong count is refused.
TEST(TurboQuantRecent, SetRecentRows) {
  const int kv_heads = 2, d = 16, recent = 3;
  const size_t row = size_t(kv_heads) * d;
  const auto k = testing::random_normal(10 * row, 91);
  const auto v = testing::random_normal(10 * row, 92);
  TurboQuantKVCache a(kv_heads, d, recent_config(4, 4, false, 1, recent));
  a.append(k.data(), v.data(), 10);
  const auto q = testing::random_normal(size_t(kv_heads) * d, 93);
  std::vector<float> out_a(row), out_b(row);
  const AttentionParams params{kv_heads, 0.25f, 0, 0};
  a.attend(q.data(), 1, params, out_a.data());
  // b: the same codes, its recent rows installed from a's.
  TurboQuantKVCache b(kv_heads, d, recent_config(4, 4, false, 1, recent));
  b.append(k.data(), v.data(), 10);
  EXPECT_THROW(b.set_recent_rows({}, 2), InvalidArgument);  // no rows for 2
  std::vector<uint16_t> rows;
  const DenseKVView view = a.recent_view();
  for (const void* part : {view.k, view.v}) {
    const auto* h16 = static_cast<const uint16_t*>(part);
    for (int h = 0; h < kv_heads; ++h) {
      for (int64_t t = 0; t < a.recent_rows(); ++t) {
        for (int j = 0; j < d; ++j) rows.push_back(h16[(h * view.head_stride + t) * d + j]);
      }
    }
  }
  EXPECT_THROW(b.set_recent_rows(rows, a.recent_rows() + 1), InvalidArgument);
  b.attend(q.data(), 1, params, out_b.data());
  b.set_recent_rows(rows, a.recent_rows());
  // The next token: both read the same window.
  const auto k1 = testing::random_normal(row, 94), v1 = testing::random_normal(row, 95);
  a.append(k1.data(), v1.data(), 1);
  b.append(k1.data(), v1.data(), 1);
  a.attend(q.data(), 1, params, out_a.data());
  b.attend(q.data(), 1, params, out_b.data());
  EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * 4), 0);
}

}  // namespace
}  // namespace turbokv
