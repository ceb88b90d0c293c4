// Save/load of a sequence's caches with its session info: identical attention after a round
// trip, tokens, settings and metadata kept, typed errors for files from another
// configuration, truncated, bit-flipped or version 1 files.
#include "kv/cache_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "attention_harness.h"
#include "core/error.h"
#include "kv/cache_policy.h"
#include "kv/kv_resolve.h"

namespace turbokv {
namespace {

// Global, sliding, global, global (last): every cache type appears across the options below.
const std::vector<LayerSpec> kLayers = {{2, 64, 0}, {2, 64, 12}, {2, 64, 0}, {2, 64, 0}};
constexpr int kHeads = 4;

ResolvedKV options(double bits, const std::string& scheme, int64_t start = 0, uint64_t seed = 0) {
  KVOptions o;
  o.kv_bits = bits;
  o.kv_quant_scheme = scheme;
  o.quantized_kv_start = start;
  o.seed = seed;
  o.last_layer_dense = false;
  return resolve_kv_options(o);
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

void fill(LayerCaches& caches, int n_tokens, uint32_t seed) {
  for (size_t i = 0; i < caches.size(); ++i) {
    const auto k = testing::random_normal(size_t(n_tokens) * 2 * 64, seed + 2 * i);
    const auto v = testing::random_normal(size_t(n_tokens) * 2 * 64, seed + 2 * i + 1);
    caches[i]->append(k.data(), v.data(), 7);  // a first chunk, then the rest
    caches[i]->append(k.data() + 7 * 128, v.data() + 7 * 128, n_tokens - 7);
  }
}

CacheFileInfo info_for(const ResolvedKV& kv, int n_tokens, const std::string& tag = "tiny-model") {
  CacheFileInfo info;
  info.model_tag = tag;
  info.model_fingerprint = 0x1234;
  info.kv = kv;
  for (int i = 0; i < n_tokens + 1; ++i) info.tokens.push_back(i * 7 % 500);
  info.metadata = R"({"messages": []})";
  return info;
}

void load(LayerCaches& caches, const std::string& path) {
  CacheFileReader(path).load_caches(caches);
}

std::vector<float> attend_all(const LayerCaches& caches) {
  const auto q = testing::random_normal(size_t(3) * kHeads * 64, 77);
  std::vector<float> out;
  for (const auto& cache : caches) {
    std::vector<float> o(q.size());
    cache->attend(q.data(), 3, AttentionParams{kHeads, 0.125f, 0, 0}, o.data());
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// The TurboQuant levers and the uniform rotation: means, sinks and per-layer bits in the file.
ResolvedKV with_levers(double bits, const std::string& scheme, bool unbiased_norm = false) {
  KVOptions o;
  o.kv_unbiased_norm = unbiased_norm;
  o.kv_bits = bits;
  o.kv_quant_scheme = scheme;
  o.last_layer_dense = false;
  if (scheme == "turboquant") {
    o.kv_centering = "both";
    o.kv_sink_tokens = 3;
    o.kv_allocation = "keys";
    o.kv_layer_bits = "0:4/2.5,-1:dense";
  } else {
    o.kv_hadamard = true;
    o.kv_layer_bits = "0:3/5";
  }
  return resolve_kv_options(o);
}

TEST(CacheFile, RoundTripGivesIdenticalAttentionForEveryCacheType) {
  const ResolvedKV configs[] = {ResolvedKV{},
                                options(3.5, "turboquant"),
                                options(3, "turboquant"),
                                options(4, "uniform"),
                                options(3.5, "turboquant", 20),
                                options(3.5, "turboquant", 500),
                                with_levers(3.5, "turboquant"),
                                with_levers(3, "turboquant", true),
                                with_levers(4, "uniform")};
  for (const ResolvedKV& kv : configs) {
    LayerCaches saved = make_layer_caches(kLayers, kv);
    fill(saved, 40, 5);
    const std::string path = temp_path("roundtrip.tkv");
    const CacheFileInfo info = info_for(kv, 40);
    save_cache_file(path, info, saved);
    CacheFileReader reader(path);
    EXPECT_EQ(reader.info().model_tag, info.model_tag);
    EXPECT_EQ(reader.info().model_fingerprint, info.model_fingerprint);
    EXPECT_EQ(reader.info().kv, kv);
    EXPECT_EQ(reader.info().tokens, info.tokens);
    EXPECT_EQ(reader.info().metadata, info.metadata);
    LayerCaches loaded = make_layer_caches(kLayers, reader.info().kv);
    reader.load_caches(loaded);
    for (size_t i = 0; i < saved.size(); ++i) {
      EXPECT_EQ(loaded[i]->type_name(), saved[i]->type_name());
      EXPECT_EQ(loaded[i]->size(), saved[i]->size());
      EXPECT_EQ(loaded[i]->nbytes(), saved[i]->nbytes());
    }
    const auto a = attend_all(saved), b = attend_all(loaded);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << kv_scheme_name(kv.scheme);
    // Both go on identically after the round trip.
    const auto k = testing::random_normal(5 * 128, 9);
    for (auto* caches : {&saved, &loaded}) {
      for (auto& cache : *caches) cache->append(k.data(), k.data(), 5);
    }
    const auto c = attend_all(saved), d = attend_all(loaded);
    EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size() * 4), 0) << kv_scheme_name(kv.scheme);
  }
}

TEST(CacheFile, OtherModelOrConfigurationIsInvalidArgument) {
  const ResolvedKV kv = options(3.5, "turboquant");
  LayerCaches saved = make_layer_caches(kLayers, kv);
  fill(saved, 30, 1);
  const std::string path = temp_path("mismatch.tkv");
  save_cache_file(path, info_for(kv, 30), saved);

  auto expect_invalid = [&](LayerCaches caches, const char* needle) {
    try {
      load(caches, path);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid(make_layer_caches({{2, 64, 0}, {2, 64, 12}}, kv), "layers");
  expect_invalid(make_layer_caches({{2, 128, 0}, {2, 128, 12}, {2, 128, 0}, {2, 128, 0}}, kv),
                 "head_dim");
  expect_invalid(make_layer_caches({{4, 64, 0}, {4, 64, 12}, {4, 64, 0}, {4, 64, 0}}, kv),
                 "kv_heads");
  expect_invalid(make_layer_caches(kLayers, options(2.5, "turboquant")), "key bits");
  expect_invalid(make_layer_caches(kLayers, options(3.5, "turboquant", 0, 7)), "seed");
  expect_invalid(make_layer_caches(kLayers, options(4, "uniform")), "cache type");
  ResolvedKV centered = kv;
  centered.center_keys = true;
  expect_invalid(make_layer_caches(kLayers, centered), "key centering");
  ResolvedKV sinks = kv;
  sinks.sink_tokens = 2;
  expect_invalid(make_layer_caches(kLayers, sinks), "sink tokens");
  expect_invalid(make_layer_caches({{2, 64, 0}, {2, 64, 8}, {2, 64, 0}, {2, 64, 0}}, kv),
                 "sliding window");
}

TEST(CacheFile, TruncatedCorruptedOrForeignFilesAreFormatErrors) {
  LayerCaches saved = make_layer_caches(kLayers, options(3, "turboquant"));
  fill(saved, 30, 2);
  const std::string path = temp_path("good.tkv");
  save_cache_file(path, info_for(options(3, "turboquant"), 30), saved);
  const std::vector<uint8_t> good = read_file(path);
  const std::string bad = temp_path("bad.tkv");
  auto expect_format_error = [&](const std::vector<uint8_t>& bytes, const char* needle) {
    write_file(bad, bytes);
    LayerCaches caches = make_layer_caches(kLayers, options(3, "turboquant"));
    try {
      load(caches, bad);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  for (size_t cut : {good.size() - 1, good.size() / 2, size_t(30), size_t(9)}) {
    expect_format_error(std::vector<uint8_t>(good.begin(), good.begin() + cut), "truncated");
  }
  expect_format_error({}, "not a turbokv cache file");
  for (size_t at : {size_t(40), good.size() / 2, good.size() - 10}) {
    std::vector<uint8_t> flipped = good;
    flipped[at] ^= 0x10;
    expect_format_error(flipped, "corrupted");
  }
  std::vector<uint8_t> other_version = good;
  other_version[8] = 9;
  expect_format_error(other_version, "version 9");
  std::vector<uint8_t> version_1 = good;
  version_1[8] = 1;
  expect_format_error(version_1, "version 1 cache file");
  std::vector<uint8_t> version_2 = good;
  version_2[8] = 2;
  expect_format_error(version_2, "version 2 cache file");
  std::vector<uint8_t> text(good.size(), 'x');
  expect_format_error(text, "not a turbokv cache file");
  EXPECT_THROW(CacheFileReader(temp_path("missing.tkv")), IoError);
}

// Bit counts far outside any setting (a fuzzed file had key bits -2.2e258) are refused when
// the file is read, before any conversion to int.
TEST(CacheFile, OutOfRangeKVSettingsAreFormatErrors) {
  LayerCaches saved = make_layer_caches(kLayers, options(3, "turboquant"));
  fill(saved, 30, 2);
  for (double bad : {-2.2e258, 1e300, -1.0, 65.0}) {
    SCOPED_TRACE(bad);
    ResolvedKV kv = options(3, "turboquant");
    kv.key_bits = bad;
    const std::string path = temp_path("bad-bits.tkv");
    save_cache_file(path, info_for(kv, 30), saved);
    LayerCaches caches = make_layer_caches(kLayers, options(3, "turboquant"));
    try {
      load(caches, path);
      ADD_FAILURE() << "no error";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("malformed KV settings"), std::string::npos) << e.what();
    }
  }
}

TEST(CacheFile, CachesHoldingMoreTokensThanTheHistoryAreRefused) {
  LayerCaches saved = make_layer_caches(kLayers, options(4, "uniform"));
  fill(saved, 30, 3);
  CacheFileInfo info = info_for(options(4, "uniform"), 30);
  info.tokens.resize(20);
  const std::string path = temp_path("short-history.tkv");
  save_cache_file(path, info, saved);
  LayerCaches caches = make_layer_caches(kLayers, options(4, "uniform"));
  EXPECT_THROW(load(caches, path), FormatError);
}

TEST(CacheFile, AnUnwritablePathIsAnIoErrorAndLeavesNoFile) {
  LayerCaches saved = make_layer_caches(kLayers, ResolvedKV{});
  fill(saved, 10, 4);
  EXPECT_THROW(save_cache_file(temp_path("no-such-dir/x.tkv"), info_for({}, 10), saved), IoError);
}

TEST(CacheFile, DescribeKVNamesTheScheme) {
  EXPECT_EQ(describe_kv(ResolvedKV{}), "dense");
  EXPECT_NE(describe_kv(options(3.5, "turboquant")).find("turboquant K3/V4"), std::string::npos);
  EXPECT_NE(describe_kv(options(4, "uniform")).find("groups of 64"), std::string::npos);
}

TEST(CacheFile, Crc32MatchesTheStandardCheckValue) {
  const char* check = "123456789";  // the CRC-32 catalogue check value is 0xCBF43926
  EXPECT_EQ(crc32(reinterpret_cast<const uint8_t*>(check), 9), 0xCBF43926u);
}

}  // namespace
}  // namespace turbokv

namespace turbokv {
namespace {

// Recent tokens: the setting and each cache's window rows are in the file; a loaded sequence
// goes on with the same bits. A version 3 file (no recent_tokens field; written here by
// cutting the field out of a version 4 file and fixing the sizes and checksum) loads with 0.
TEST(CacheFile, RecentTokensRoundTripAndVersion3Files) {
  KVOptions o;
  o.kv_bits = 3.5;
  o.last_layer_dense = false;
  o.kv_sink_tokens = 1;
  o.kv_recent_tokens = 5;
  const ResolvedKV kv = resolve_kv_options(o);
  LayerCaches saved = make_layer_caches(kLayers, kv);
  fill(saved, 30, 11);
  const std::string path = temp_path("recent.tkv");
  save_cache_file(path, info_for(kv, 30), saved);
  LayerCaches loaded = make_layer_caches(kLayers, kv);
  CacheFileReader reader(path);
  EXPECT_EQ(reader.info().kv.recent_tokens, 5);
  reader.load_caches(loaded);
  const auto k = testing::random_normal(size_t(2) * 64, 12), v = testing::random_normal(128, 13);
  for (LayerCaches* caches : {&saved, &loaded}) {
    for (auto& cache : *caches) cache->append(k.data(), v.data(), 1);
  }
  const auto q = testing::random_normal(size_t(kHeads) * 64, 14);
  for (size_t l = 0; l < saved.size(); ++l) {
    std::vector<float> a(q.size()), b(q.size());
    saved[l]->attend(q.data(), 1, AttentionParams{kHeads, 0.125f, 0, 0}, a.data());
    loaded[l]->attend(q.data(), 1, AttentionParams{kHeads, 0.125f, 0, 0}, b.data());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "layer " << l;
  }
  EXPECT_NE(describe_kv(kv).find("5 recent tokens"), std::string::npos) << describe_kv(kv);

  // Version 3: the same settings without recent_tokens.
  const ResolvedKV plain = options(3, "turboquant");
  LayerCaches caches = make_layer_caches(kLayers, plain);
  fill(caches, 30, 15);
  const std::string v4_path = temp_path("v4.tkv");
  CacheFileInfo info = info_for(plain, 30);
  save_cache_file(v4_path, info, caches);
  std::vector<uint8_t> bytes = read_file(v4_path);
  const size_t header = 8 + 4 + 8;
  // model tag (u32 + bytes), fingerprint, then the settings up to hadamard: 55 bytes.
  const size_t field = header + 4 + info.model_tag.size() + 8 + 55;
  int32_t recent = -1;
  std::memcpy(&recent, bytes.data() + field, 4);
  ASSERT_EQ(recent, 0);
  bytes.erase(bytes.begin() + field, bytes.begin() + field + 4);
  const uint32_t version = 3;
  std::memcpy(bytes.data() + 8, &version, 4);
  uint64_t payload = 0;
  std::memcpy(&payload, bytes.data() + 12, 8);
  payload -= 4;
  std::memcpy(bytes.data() + 12, &payload, 8);
  const uint32_t crc = crc32(bytes.data(), bytes.size() - 4);
  std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
  const std::string v3_path = temp_path("v3.tkv");
  write_file(v3_path, bytes);
  LayerCaches old = make_layer_caches(kLayers, plain);
  CacheFileReader v3(v3_path);
  EXPECT_EQ(v3.info().kv, plain);
  v3.load_caches(old);
  EXPECT_EQ(attend_all(old), attend_all(caches));
}

}  // namespace
}  // namespace turbokv
