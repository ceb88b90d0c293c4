// TurboQuantKVCache levers: centering (per-head fp16 means of the first coded chunk, subtracted
// before the unchanged codec) and fp16 sink tokens merged by log-sum-exp. Checked against plain
// arithmetic written here (means in double, codes of the centered vectors from the codec
// itself) and against the reference attention over the dequantized cache on the shared cases.
#include <gtest/gtest.h>

#include <cstring>

#include "attention_harness.h"
#include "core/error.h"
#include "core/half.h"
#include "kv/byte_io.h"
#include "kv/turboquant_kv_cache.h"

namespace turbokv {
namespace {

// Inputs with a mean far from zero (per channel), so centering changes the coded vectors and
// the key shift q.mu_k is large next to the scores' spread.
void add_offsets(std::vector<float>& x, int row, uint32_t seed) {
  const auto offset = testing::random_normal(size_t(row), seed, 3.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] += offset[i % size_t(row)];
}

TurboQuantKVConfig lever_config(double key_bits, double value_bits, bool keys, bool values,
                                int sinks) {
  TurboQuantKVConfig c{key_bits, value_bits, 3, true};
  c.center_keys = keys;
  c.center_values = values;
  c.sink_tokens = sinks;
  return c;
}

TEST(TurboQuantLevers, AttendMatchesReferenceOnDequantizedCache) {
  const testing::ScopedCodeProducts exact(CodeProducts::kExact);
  const TurboQuantKVConfig configs[] = {
      lever_config(3, 4, true, true, 0),   lever_config(3, 4, true, false, 4),
      lever_config(3.5, 4, true, true, 1), lever_config(2, 2.5, false, true, 5),
      lever_config(4, 3, true, true, 16),
  };
  uint32_t seed = 500;
  size_t index = 0;
  for (const testing::AttentionCase& c : testing::attention_cases()) {
    if (c.head_dim < 4 || c.softcap > 0) continue;  // key centering refuses soft-capping
    const TurboQuantKVConfig& config = configs[index++ % std::size(configs)];
    auto in = testing::make_inputs(c, seed++);
    const int row = c.kv_heads * c.head_dim;
    add_offsets(in.k, row, seed++);
    add_offsets(in.v, row, seed++);
    TurboQuantKVCache cache(c.kv_heads, c.head_dim, config);
    const size_t r = size_t(row);
    if (c.n_past > 0) cache.append(in.k.data(), in.v.data(), static_cast<int>(c.n_past));
    cache.append(in.k.data() + c.n_past * r, in.v.data() + c.n_past * r, c.n_q);
    ASSERT_EQ(cache.sink_rows(), std::min<int64_t>(config.sink_tokens, c.n_tokens()));
    const DenseKVCache dequantized = cache.to_dense();
    auto expected = testing::output_buffer(c);
    attention_reference(dequantized.view(), AttentionQueries{in.q.data(), c.n_q, c.n_past},
                        c.params(), expected.data());
    auto got = testing::output_buffer(c);
    cache.attend(in.q.data(), c.n_q, c.params(), got.data());
    testing::expect_attention_close(c, expected, got, 2e-4,
                                    "levers K" + std::to_string(config.key_bits) + " sinks" +
                                        std::to_string(config.sink_tokens));
  }
}

TEST(TurboQuantLevers, MeansAreTheFp16MeanOfTheFirstCodedChunk) {
  const int kv_heads = 2, d = 64, sinks = 3, first = 20;
  const int row = kv_heads * d;
  auto k = testing::random_normal(size_t(40) * row, 41);
  auto v = testing::random_normal(size_t(40) * row, 42);
  add_offsets(k, row, 43);
  add_offsets(v, row, 44);
  TurboQuantKVCache cache(kv_heads, d, lever_config(3, 4, true, true, sinks));
  cache.append(k.data(), v.data(), 2);  // sinks only: nothing calibrated yet
  EXPECT_FALSE(cache.calibrated());
  EXPECT_TRUE(cache.key_means().empty());
  cache.append(k.data() + 2 * row, v.data() + 2 * row, first - 2);
  ASSERT_TRUE(cache.calibrated());
  cache.append(k.data() + first * row, v.data() + first * row, 20);  // later chunks: no change
  // The first coded chunk: positions 3..19 of the second append.
  for (auto [x, means] : {std::pair{&k, &cache.key_means()}, std::pair{&v, &cache.value_means()}}) {
    ASSERT_EQ(means->size(), size_t(row));
    for (int i = 0; i < row; ++i) {
      double sum = 0;
      for (int t = sinks; t < first; ++t) sum += (*x)[size_t(t) * row + i];
      EXPECT_EQ((*means)[i], f32_to_f16(float(sum / (first - sinks)))) << i;
    }
  }
}

TEST(TurboQuantLevers, CodedVectorsAreTheCodecOfXMinusMean) {
  const int kv_heads = 2, d = 128, n = 30;
  const int row = kv_heads * d;
  auto k = testing::random_normal(size_t(n) * row, 51);
  auto v = testing::random_normal(size_t(n) * row, 52);
  add_offsets(k, row, 53);
  add_offsets(v, row, 54);
  const TurboQuantKVConfig config = lever_config(3, 4, true, true, 2);
  TurboQuantKVCache cache(kv_heads, d, config);
  cache.append(k.data(), v.data(), n);
  const auto key_codec = quant::make_turboquant_codec({d, 3, 3, quant::TensorRole::kKey, true, {}});
  std::vector<float> centered(d);
  std::vector<uint8_t> codes(key_codec->code_bytes());
  uint16_t norm = 0;
  for (int t = 2; t < n; ++t) {
    for (int h = 0; h < kv_heads; ++h) {
      for (int j = 0; j < d; ++j) {
        centered[j] = k[size_t(t) * row + h * d + j] - f16_to_f32(cache.key_means()[h * d + j]);
      }
      key_codec->quantize(centered.data(), codes.data(), &norm);
      ASSERT_EQ(std::memcmp(codes.data(), cache.key_rows().codes(h, t - 2), codes.size()), 0)
          << "token " << t << " head " << h;
      ASSERT_EQ(norm, cache.key_rows().aux(h, t - 2)[0]);
    }
  }
  // The sinks are the fp16 inputs.
  std::vector<float> sk, sv;
  cache.to_dense().copy_tokens(0, 2, &sk, &sv);
  for (int i = 0; i < 2 * row; ++i) {
    EXPECT_EQ(sk[i], f16_to_f32(f32_to_f16(k[i])));
    EXPECT_EQ(sv[i], f16_to_f32(f32_to_f16(v[i])));
  }
}

TEST(TurboQuantLevers, NbytesCountsSinksAndMeans) {
  const int kv_heads = 8, d = 128;
  const auto kv = testing::random_normal(size_t(300) * kv_heads * d, 5);
  TurboQuantKVCache cache(kv_heads, d, lever_config(3, 4, true, false, 4));
  cache.append(kv.data(), kv.data(), 3);
  EXPECT_EQ(cache.nbytes(), 3u * kv_heads * d * 2 * 2);  // fp16 keys and values, no means yet
  cache.append(kv.data(), kv.data(), 297);
  // 4 sinks at 256 + 256 bytes per head (fp16 keys and values), 296 coded tokens at 116 bytes
  // per head (48 + 2 for 3-bit keys, 64 + 2 for 4-bit values), the key means 2 bytes per
  // channel per head.
  EXPECT_EQ(cache.nbytes(), 4u * kv_heads * 512 + 296u * kv_heads * 116 + 2u * kv_heads * d);
}

TEST(TurboQuantLevers, TrimCrossesIntoTheSinksAndKeepsTheMeans) {
  const int kv_heads = 2, d = 64, heads = 4;
  const size_t row = size_t(kv_heads) * d;
  const auto k = testing::random_normal(30 * row, 61);
  const auto v = testing::random_normal(30 * row, 62);
  const auto q = testing::random_normal(size_t(heads) * d, 63);
  const TurboQuantKVConfig config = lever_config(3, 4, true, true, 5);
  TurboQuantKVCache trimmed(kv_heads, d, config), clean(kv_heads, d, config);
  trimmed.append(k.data(), v.data(), 12);
  const std::vector<uint16_t> means = trimmed.key_means();
  trimmed.trim(9);  // 3 tokens left, all sinks
  EXPECT_EQ(trimmed.sink_rows(), 3);
  EXPECT_EQ(trimmed.coded_rows(), 0);
  EXPECT_EQ(trimmed.key_means(), means);
  trimmed.append(k.data() + 3 * row, v.data() + 3 * row, 9);
  clean.append(k.data(), v.data(), 12);
  std::vector<float> out_t(heads * d), out_c(heads * d);
  const AttentionParams params{heads, 0.125f, 0, 0};
  trimmed.attend(q.data(), 1, params, out_t.data());
  clean.attend(q.data(), 1, params, out_c.data());
  EXPECT_EQ(std::memcmp(out_t.data(), out_c.data(), out_t.size() * 4), 0);
}

TEST(TurboQuantLevers, SaveLoadKeepsMeansSinksAndCodes) {
  const int kv_heads = 2, d = 64, heads = 4;
  const size_t row = size_t(kv_heads) * d;
  auto k = testing::random_normal(40 * row, 71);
  auto v = testing::random_normal(40 * row, 72);
  add_offsets(k, int(row), 73);
  const TurboQuantKVConfig config = lever_config(3.5, 4, true, true, 3);
  TurboQuantKVCache cache(kv_heads, d, config);
  cache.append(k.data(), v.data(), 40);
  ByteWriter out;
  cache.save(out);
  TurboQuantKVCache loaded(kv_heads, d, config);
  ByteReader in(out.buffer().data(), out.buffer().size());
  loaded.load(in);
  EXPECT_EQ(in.remaining(), 0u);
  EXPECT_EQ(loaded.key_means(), cache.key_means());
  EXPECT_EQ(loaded.value_means(), cache.value_means());
  EXPECT_EQ(loaded.key_channel_orders(), cache.key_channel_orders());
  EXPECT_EQ(loaded.nbytes(), cache.nbytes());
  const auto q = testing::random_normal(size_t(heads) * d, 74);
  std::vector<float> a(heads * d), b(heads * d);
  const AttentionParams params{heads, 0.125f, 0, 0};
  cache.attend(q.data(), 1, params, a.data());
  loaded.attend(q.data(), 1, params, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  // Another configuration refuses the record, naming the field.
  TurboQuantKVConfig unbiased = config;
  unbiased.unbiased_norm = true;
  for (const TurboQuantKVConfig& other :
       {lever_config(3.5, 4, false, true, 3), lever_config(3.5, 4, true, true, 2), unbiased}) {
    TurboQuantKVCache mismatch(kv_heads, d, other);
    ByteReader again(out.buffer().data(), out.buffer().size());
    try {
      mismatch.load(again);
      ADD_FAILURE() << "loaded into another configuration";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("centering") != std::string::npos ||
                  what.find("sink tokens") != std::string::npos ||
                  what.find("norm mode") != std::string::npos)
          << what;
    }
  }
}

// The identities centering rests on, on a dense f32 path: subtracting a per-head mu_k from every
// key leaves the attention unchanged, and attention over v - mu_v plus mu_v is the attention
// over v (the probabilities sum to 1).
TEST(TurboQuantLevers, CenteringDoesNotChangeDenseAttention) {
  uint32_t seed = 700;
  for (const testing::AttentionCase& c : testing::attention_cases()) {
    if (c.softcap > 0) continue;  // soft-capping is not shift-invariant
    auto in = testing::make_inputs(c, seed++);
    const int row = c.kv_heads * c.head_dim;
    add_offsets(in.k, row, seed++);
    add_offsets(in.v, row, seed++);
    const auto mu_k = testing::random_normal(size_t(row), seed++, 3.0f);
    const auto mu_v = testing::random_normal(size_t(row), seed++, 3.0f);
    std::vector<float> ck(in.k.size()), cv(in.v.size());
    for (size_t i = 0; i < in.k.size(); ++i) {
      ck[i] = in.k[i] - mu_k[i % size_t(row)];
      cv[i] = in.v[i] - mu_v[i % size_t(row)];
    }
    DenseKVCache plain(c.kv_heads, c.head_dim, KVDType::kF32);
    DenseKVCache centered(c.kv_heads, c.head_dim, KVDType::kF32);
    plain.append(in.k.data(), in.v.data(), static_cast<int>(c.n_tokens()));
    centered.append(ck.data(), cv.data(), static_cast<int>(c.n_tokens()));
    const AttentionQueries queries{in.q.data(), c.n_q, c.n_past};
    auto expected = testing::output_buffer(c);
    auto got = testing::output_buffer(c);
    attention_reference(plain.view(), queries, c.params(), expected.data());
    attention_reference(centered.view(), queries, c.params(), got.data());
    const int group = c.n_heads() / c.kv_heads;
    for (size_t r = 0; r < size_t(c.n_q) * c.n_heads(); ++r) {
      const int kv_head = int(r % size_t(c.n_heads())) / group;
      for (int j = 0; j < c.head_dim; ++j)
        got[r * c.head_dim + j] += mu_v[kv_head * c.head_dim + j];
    }
    testing::expect_attention_close(c, expected, got, 1e-4, "centered dense");
  }
}

// While a sequence fits in the sinks the cache is a dense fp16 cache: the same bits out.
TEST(TurboQuantLevers, SinkRowsAttendAsADenseFp16Cache) {
  uint32_t seed = 800;
  for (const testing::AttentionCase& c : testing::attention_cases()) {
    if (c.head_dim < 4) continue;
    const auto in = testing::make_inputs(c, seed++);
    TurboQuantKVCache cache(c.kv_heads, c.head_dim,
                            lever_config(3, 4, c.softcap == 0, true, int(c.n_tokens())));
    DenseKVCache dense(c.kv_heads, c.head_dim, KVDType::kF16);
    cache.append(in.k.data(), in.v.data(), static_cast<int>(c.n_tokens()));
    dense.append(in.k.data(), in.v.data(), static_cast<int>(c.n_tokens()));
    ASSERT_EQ(cache.coded_rows(), 0);
    auto expected = testing::output_buffer(c);
    auto got = testing::output_buffer(c);
    dense.attend(in.q.data(), c.n_q, c.params(), expected.data());
    cache.attend(in.q.data(), c.n_q, c.params(), got.data());
    EXPECT_EQ(std::memcmp(expected.data(), got.data(), got.size() * sizeof(float)), 0)
        << "n_tokens " << c.n_tokens();
  }
}

TEST(TurboQuantLevers, SoftCappedScoresWithCenteredKeysAreUnsupported) {
  TurboQuantKVCache cache(1, 16, lever_config(3, 4, true, false, 0));
  const auto kv = testing::random_normal(16 * 4, 81);
  cache.append(kv.data(), kv.data(), 4);
  std::vector<float> q(2 * 16), out(2 * 16);
  EXPECT_THROW(cache.attend(q.data(), 1, AttentionParams{2, 0.25f, 50.0f, 0}, out.data()),
               Unsupported);
  EXPECT_THROW(TurboQuantKVCache(1, 16, lever_config(3, 4, true, false, -1)), InvalidArgument);
}

// calibrate_from (what the device caches take their state from) fixes the state append()
// fixes: the same record, for a first chunk before, across and past the sink tokens.
TEST(TurboQuantLevers, CalibrateFromFixesTheStateAppendFixes) {
  const int heads = 2, d = 64, row = heads * d;
  for (const TurboQuantKVConfig& c :
       {lever_config(3, 4, true, true, 0), lever_config(3.5, 4, false, true, 4),
        lever_config(2.5, 3, true, false, 10), lever_config(3, 3, false, false, 0)}) {
    for (auto [before, n] : std::vector<std::pair<int, int>>{{0, 30}, {0, 3}, {3, 20}, {4, 9}}) {
      if (before > c.sink_tokens) continue;  // tokens held past the sinks: calibrated already
      SCOPED_TRACE(::testing::Message() << c.key_bits << "/" << c.value_bits << " sinks "
                                        << c.sink_tokens << " at " << before << " n " << n);
      std::vector<float> k = testing::random_normal(size_t(before + n) * row, 7, 1.0f);
      std::vector<float> v = testing::random_normal(k.size(), 8, 2.0f);
      add_offsets(k, row, 9);
      TurboQuantKVCache appended(heads, d, c), direct(heads, d, c);
      if (before > 0) appended.append(k.data(), v.data(), before);
      appended.append(k.data() + size_t(before) * row, v.data() + size_t(before) * row, n);
      appended.trim(before + n);
      direct.calibrate_from(k.data() + size_t(before) * row, v.data() + size_t(before) * row, n,
                            before);
      ByteWriter a, b;
      appended.write_state(a);
      direct.write_state(b);
      EXPECT_EQ(a.buffer(), b.buffer());
      EXPECT_EQ(appended.calibration_tokens(), direct.calibration_tokens());
      EXPECT_EQ(direct.size(), 0);
    }
  }
}

}  // namespace
}  // namespace turbokv
