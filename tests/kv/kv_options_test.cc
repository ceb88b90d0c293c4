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

TEST(KVOptions, LayerBitsParseAndCheckPerScheme) {
  KVOptions o;
  o.kv_bits = 3.5;
  o.kv_layer_bits = "0:4/5,-1:dense,2:2.5";
  const ResolvedKV r = resolve_kv_options(o);
  ASSERT_EQ(r.layer_bits.size(), 3u);
  EXPECT_EQ(r.layer_bits[0].layer, 0);
  EXPECT_EQ(r.layer_bits[0].key_bits, 4);
  EXPECT_EQ(r.layer_bits[0].value_bits, 5);
  EXPECT_EQ(r.layer_bits[1].layer, -1);
  EXPECT_TRUE(r.layer_bits[1].dense);
  EXPECT_EQ(r.layer_bits[2].key_bits, 2.5);
  EXPECT_EQ(r.layer_bits[2].value_bits, 2.5);
  EXPECT_EQ(layer_bits_text(r.layer_bits), "0:4/5,-1:dense,2:2.5/2.5");
  for (const char* bad : {"4/5", "x:4", "0:", "0:4/", "0:9", "0:2.25", ":4"}) {
    o.kv_layer_bits = bad;
    try {
      resolve_kv_options(o);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.param(), "kv_layer_bits") << bad;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  o.kv_bits = 4;  // uniform: integers only
  o.kv_layer_bits = "1:3.5";
  EXPECT_THROW(resolve_kv_options(o), InvalidArgument);
  o.kv_layer_bits = "1:3/8";
  EXPECT_EQ(resolve_kv_options(o).layer_bits[0].value_bits, 8);
}

TEST(KVOptions, LeverValuesAreCheckedAndNamed) {
  const auto param_of = [](const KVOptions& o) {
    try {
      resolve_kv_options(o);
    } catch (const InvalidArgument& e) {
      return e.param();
    }
    return std::string("accepted");
  };
  KVOptions o;
  o.kv_bits = 3.5;
  o.kv_centering = "sideways";
  EXPECT_EQ(param_of(o), "kv_centering");
  o.kv_centering = "values";
  const ResolvedKV r = resolve_kv_options(o);
  EXPECT_FALSE(r.center_keys);
  EXPECT_TRUE(r.center_values);
  o.kv_sink_tokens = -1;
  EXPECT_EQ(param_of(o), "kv_sink_tokens");
  o.kv_sink_tokens = 70000;
  EXPECT_EQ(param_of(o), "kv_sink_tokens");
  o.kv_sink_tokens = 4;
  EXPECT_EQ(resolve_kv_options(o).sink_tokens, 4);
  o.kv_recent_tokens = -1;
  EXPECT_EQ(param_of(o), "kv_recent_tokens");
  o.kv_recent_tokens = 1025;
  EXPECT_EQ(param_of(o), "kv_recent_tokens");
  o.kv_recent_tokens = 3;
  EXPECT_EQ(resolve_kv_options(o).recent_tokens, 3);
  o.kv_allocation = "greedy";
  EXPECT_EQ(param_of(o), "kv_allocation");
  o.kv_allocation = "none";
  o.kv_budget = 3.75;  // a budget without the allocation
  EXPECT_EQ(param_of(o), "kv_budget");
  o.kv_allocation = "auto";
  EXPECT_EQ(resolve_kv_options(o).budget_bits, 3.75);
  o.kv_budget = 0.5;
  EXPECT_EQ(param_of(o), "kv_budget");
  o.kv_budget.reset();
  o.kv_unbiased_norm = true;
  EXPECT_TRUE(resolve_kv_options(o).unbiased_norm);
  o.norm_correction = false;  // the unbiased norm replaces the norm correction, not the plain norm
  EXPECT_EQ(param_of(o), "kv_unbiased_norm");
  KVOptions uniform;
  uniform.kv_bits = 4;
  uniform.kv_unbiased_norm = true;
  EXPECT_EQ(param_of(uniform), "kv_unbiased_norm");
  uniform.kv_unbiased_norm = false;
  uniform.kv_recent_tokens = 2;
  EXPECT_EQ(param_of(uniform), "kv_recent_tokens");
}

}  // namespace
}  // namespace turbokv
