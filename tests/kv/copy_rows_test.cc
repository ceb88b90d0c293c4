// Copies of cache rows (the prefix cache's and the sessions' interface): rows copied out of a
// cache and appended to a fresh cache in the source's state rebuild exactly the cache that fed
// the same tokens, for every cache type; calibration_tokens() names what fixed the state.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "kv/byte_io.h"
#include "kv/cache_policy.h"
#include "kv/dense_kv_cache.h"
#include "kv/kv_resolve.h"
#include "tests/common/random.h"

namespace turbokv {
namespace {

constexpr int kKVHeads = 2, kDim = 64, kHeads = 4;
constexpr int kRow = kKVHeads * kDim;

ResolvedKV kv_of(std::optional<double> bits, const std::string& scheme,
                 std::optional<double> key_bits = {}, int64_t start = 0) {
  KVOptions o;
  o.kv_bits = bits;
  o.kv_key_bits = key_bits;
  o.kv_quant_scheme = scheme;
  o.quantized_kv_start = start;
  o.last_layer_dense = false;
  return resolve_kv_options(o);
}

std::unique_ptr<KVCache> make(const ResolvedKV& kv) {
  return std::move(make_layer_caches({{kKVHeads, kDim, 0}}, kv).front());
}

// Appends tokens [first, first + n) of a fixed random sequence.
void feed(KVCache& cache, int first, int n) {
  const auto k = testing::random_normal(size_t(first + n) * kRow, 11);
  const auto v = testing::random_normal(size_t(first + n) * kRow, 12);
  cache.append(k.data() + size_t(first) * kRow, v.data() + size_t(first) * kRow, n);
}

std::vector<float> attend(const KVCache& cache, int n_q) {
  const auto q = testing::random_normal(size_t(n_q) * kHeads * kDim, 13);
  std::vector<float> out(q.size());
  cache.attend(q.data(), n_q, AttentionParams{kHeads, 0.125f, 0, 0}, out.data());
  return out;
}

void expect_same(const KVCache& a, const KVCache& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(a.type_name(), b.type_name()) << what;
  EXPECT_EQ(a.calibration_tokens(), b.calibration_tokens()) << what;
  const auto x = attend(a, 3), y = attend(b, 3);
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << what;
}

std::string state_of(const KVCache& cache) {
  ByteWriter out;
  cache.write_state(out);
  return std::string(out.buffer().begin(), out.buffer().end());
}

void install_state(KVCache& cache, const std::string& state) {
  ByteReader in(reinterpret_cast<const uint8_t*>(state.data()), state.size());
  cache.read_state(in);
}

struct Config {
  const char* name;
  ResolvedKV kv;
};

std::vector<Config> configs() {
  return {{"dense", kv_of({}, "uniform")},
          {"uniform 4", kv_of(4, "uniform")},
          {"turboquant 3", kv_of(3, "turboquant")},
          {"turboquant K3/V4", kv_of(3.5, "turboquant")},
          {"turboquant split keys 3.5", kv_of(3.5, "turboquant", 3.5)},
          {"staged, converted", kv_of(3.5, "turboquant", 3.5, 20)},
          {"staged, still dense", kv_of(3.5, "turboquant", 3.5, 500)}};
}

TEST(CopyRows, CopiedRowsRebuildTheCacheThatFedTheSameTokens) {
  for (const Config& c : configs()) {
    auto source = make(c.kv);
    feed(*source, 0, 16);  // the chunks a prefill would feed
    feed(*source, 16, 24);
    const std::string state = state_of(*source);
    for (int m : {16, 32, 40}) {
      // What the source held after m tokens: the same chunks, trimmed.
      auto reference = make(c.kv);
      feed(*reference, 0, 16);
      feed(*reference, 16, 24);
      reference->trim(40 - m);
      auto copy = make(c.kv);
      install_state(*copy, state);
      for (int first = 0; first < m; first += 16) {  // block by block, as the prefix cache does
        copy->append_rows(*source->copy_rows(first, std::min(16, m - first)));
      }
      const std::string what = std::string(c.name) + ", " + std::to_string(m) + " tokens";
      expect_same(*reference, *copy, what);
      // Both code new tokens alike: the state went along with the rows.
      feed(*reference, 40, 5);
      feed(*copy, 40, 5);
      expect_same(*reference, *copy, what + " + 5");
    }
  }
}

TEST(CopyRows, CalibrationTokensNameWhatFixedTheState) {
  auto calibration_after = [](const ResolvedKV& kv, std::vector<int> chunks) {
    auto cache = make(kv);
    int fed = 0;
    for (int n : chunks) {
      feed(*cache, fed, n);
      fed += n;
    }
    return cache->calibration_tokens();
  };
  EXPECT_EQ(calibration_after(kv_of({}, "uniform"), {7, 9}), 0);
  EXPECT_EQ(calibration_after(kv_of(4, "uniform"), {7, 9}), 0);
  EXPECT_EQ(calibration_after(kv_of(3.5, "turboquant"), {7, 9}), 0);       // K3/V4: nothing split
  EXPECT_EQ(calibration_after(kv_of(3.5, "turboquant", 3.5), {7, 9}), 7);  // the first chunk
  EXPECT_EQ(calibration_after(kv_of(3.5, "turboquant", {}, 20), {16, 16}), 32);  // converted
  EXPECT_EQ(calibration_after(kv_of(3.5, "turboquant", {}, 20), {16}), 0);       // still dense
}

TEST(CopyRows, RowsOutsideTheCacheAreInvalidArguments) {
  for (const Config& c : configs()) {
    auto cache = make(c.kv);
    feed(*cache, 0, 40);
    EXPECT_THROW(cache->copy_rows(30, 20), InvalidArgument) << c.name;
    EXPECT_THROW(cache->copy_rows(-1, 5), InvalidArgument) << c.name;
    EXPECT_EQ(cache->copy_rows(40, 0)->tokens(), 0) << c.name;
  }
}

TEST(CopyRows, RowsOfAnotherCacheTypeAreRefused) {
  auto uniform = make(kv_of(4, "uniform"));
  feed(*uniform, 0, 16);
  auto dense = make(kv_of({}, "uniform"));
  EXPECT_THROW(dense->append_rows(*uniform->copy_rows(0, 16)), Error);
}

TEST(CopyRows, ASlidingWindowCacheCopiesOnlyThePositionsItHolds) {
  RotatingKVCache cache(kKVHeads, kDim, /*window=*/8);
  for (int i = 0; i < 600; i += 4) feed(cache, i, 4);  // evicts lazily, when the buffer is full
  EXPECT_THROW(cache.copy_rows(0, 4), InvalidArgument);
  const auto rows = cache.copy_rows(596, 4);
  EXPECT_EQ(rows->tokens(), 4);
  EXPECT_EQ(cache.calibration_tokens(), 0);
}

TEST(CopyRows, ReadStateRefusesAnotherConfigurationNamingTheField) {
  auto tq = make(kv_of(3.5, "turboquant"));
  auto other_bits = make(kv_of(2.5, "turboquant"));
  try {
    install_state(*other_bits, state_of(*tq));
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("key bits"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace turbokv
