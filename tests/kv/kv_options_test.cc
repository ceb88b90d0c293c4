// The KV selection rules (docs/design.md, "Choosing the KV scheme"; the mlx-vlm contract).
#include "turbokv/kv_options.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/kv_resolve.h"

namespace turbokv {
namespace {

ResolvedKV resolve(std::optional<double> bits, std::string scheme = "uniform") {
  KVOptions o;
  o.kv_bits = bits;
  o.kv_quant_scheme = scheme;
  return resolve_kv_options(o);
}

TEST(KVOptions, SelectionRules) {
  EXPECT_EQ(resolve(std::nullopt).scheme, KVScheme::kDense);
  auto r = resolve(3.5);
  EXPECT_EQ(r.scheme, KVScheme::kTurboQuant);
  EXPECT_EQ(r.key_bits, 3);
  EXPECT_EQ(r.value_bits, 4);
  r = resolve(4, "turboquant");
  EXPECT_EQ(r.scheme, KVScheme::kTurboQuant);
  EXPECT_EQ(r.key_bits, 4);
  EXPECT_EQ(r.value_bits, 4);
  r = resolve(4);
  EXPECT_EQ(r.scheme, KVScheme::kUniform);
  EXPECT_EQ(r.key_bits, 4);
  r = resolve(2.5, "turboquant");
  EXPECT_EQ(r.key_bits, 2);
  EXPECT_EQ(r.value_bits, 3);
  KVOptions o;
  o.kv_bits = 3.5;
  o.kv_key_bits = 3.5;
  r = resolve_kv_options(o);
  EXPECT_EQ(r.key_bits, 3.5);  // split codec on keys
  EXPECT_EQ(r.value_bits, 4);
}

void expect_invalid(std::optional<double> bits, const std::string& scheme,
                    const std::string& needle) {
  try {
    resolve(bits, scheme);
    FAIL() << "accepted " << (bits ? *bits : -1) << " " << scheme;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(KVOptions, InvalidValuesNameWhatIsAllowed) {
  expect_invalid(0.3, "uniform", "multiples of 0.5");
  expect_invalid(2.25, "uniform", "multiples of 0.5");
  expect_invalid(9, "uniform", "2..8");
  expect_invalid(9, "turboquant", "[1, 8]");
  expect_invalid(1, "uniform", "2..8");
  expect_invalid(4, "foo", "'foo'");
  EXPECT_THROW(parse_kv_bits("abc"), InvalidArgument);
  EXPECT_THROW(parse_kv_bits(""), InvalidArgument);
  EXPECT_THROW(parse_kv_bits("3.5x"), InvalidArgument);
  EXPECT_EQ(parse_kv_bits("3.5"), 3.5);
}

}  // namespace
}  // namespace turbokv
