// config.json parsing: the family quirks the hf-tiny fixtures exercise, RoPE scaling rules of
// transformers' modeling_rope_utils, and errors naming the bad field or architecture.
#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "core/error.h"
#include "model/rope_scaling.h"
#include "test_util.h"

namespace turbokv {
namespace {

using testing::fixture;

ModelConfig tiny(const char* family) {
  return load_model_config(fixture(std::string("hf-tiny/") + family));
}

TEST(Config, Gemma2) {
  const ModelConfig c = tiny("gemma2");
  EXPECT_EQ(c.sliding_window, (std::vector<int>{8, 0}));
  EXPECT_FLOAT_EQ(c.attention_scale, 0.25f);  // query_pre_attn_scalar 16
  EXPECT_FLOAT_EQ(c.attn_logit_softcap, 50.0f);
  EXPECT_FLOAT_EQ(c.final_logit_softcap, 30.0f);
  EXPECT_FLOAT_EQ(c.embedding_scale, 8.0f);
  EXPECT_TRUE(c.norm_plus_one && c.sandwich_norms && c.tie_word_embeddings);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
}

TEST(Config, Gemma3LocalRopeAndPattern) {
  const ModelConfig c = tiny("gemma3_text");
  EXPECT_EQ(c.sliding_window, (std::vector<int>{8, 8}));
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  ASSERT_TRUE(c.rope_local.has_value());
  EXPECT_DOUBLE_EQ(c.rope_local->theta, 1e4);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FLOAT_EQ(c.attn_logit_softcap, 0.0f);
}

TEST(Config, MistralPhi3Qwen) {
  EXPECT_EQ(tiny("mistral").sliding_window, (std::vector<int>{8, 8}));
  const ModelConfig phi3 = tiny("phi3");
  EXPECT_TRUE(phi3.fused_qkv && phi3.fused_gate_up);
  EXPECT_EQ(phi3.sliding_window, (std::vector<int>{0, 0}));
  EXPECT_TRUE(tiny("qwen2").qkv_bias);
  EXPECT_FALSE(tiny("qwen2").o_bias);
  const ModelConfig moe = tiny("qwen3_moe");
  EXPECT_EQ(moe.num_experts, 4);
  EXPECT_EQ(moe.num_experts_per_token, 2);
  EXPECT_EQ(moe.moe_intermediate_size, 32);
  EXPECT_EQ(moe.moe_layer, (std::vector<bool>{true, true}));
  EXPECT_TRUE(moe.qk_norm);
}

// The Qwen3.5 MoE variant (transformers' Qwen3_5MoeTextConfig fields): every layer sparse, the
// top-k weights renormalized whatever norm_topk_prob says, a gated shared expert.
TEST(Config, Qwen3_5MoeEveryLayerSparseWithAGatedSharedExpert) {
  std::ifstream in(fixture("hf-tiny/qwen3_5_text/config.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["model_type"] = "qwen3_5_moe_text";
  j.erase("intermediate_size");
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  j["shared_expert_intermediate_size"] = 48;
  j["norm_topk_prob"] = false;
  const ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.num_experts_per_token, 2);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.shared_expert_intermediate, 48);
  EXPECT_EQ(c.shared_expert_name, "shared_expert");
  EXPECT_TRUE(c.shared_expert_gate && c.norm_topk_prob);
  EXPECT_EQ(c.moe_layer, std::vector<bool>(8, true));
  EXPECT_EQ(c.layer_kind[0], LayerKind::kLinearAttention);
  j["num_experts_per_tok"] = 5;
  EXPECT_THROW(parse_model_config(j, "config.json"), FormatError);
}

TEST(Config, GemmaLayerPatternWithoutLayerTypes) {
  nlohmann::json j = {{"model_type", "gemma3_text"},
                      {"vocab_size", 16},
                      {"hidden_size", 8},
                      {"intermediate_size", 16},
                      {"num_hidden_layers", 7},
                      {"num_attention_heads", 2},
                      {"head_dim", 4},
                      {"sliding_window", 32},
                      {"sliding_window_pattern", 3},
                      {"rope_theta", 1e6},
                      {"rope_local_base_freq", 1e4}};
  const ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.sliding_window, (std::vector<int>{32, 32, 0, 32, 32, 0, 32}));
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rope_local->theta, 1e4);
}

TEST(Config, UnsupportedArchitectureNamesItAndTheSupportedOnes) {
  nlohmann::json j = {{"model_type", "bert"}, {"architectures", {"BertForMaskedLM"}}};
  try {
    parse_model_config(j, "x/config.json");
    FAIL();
  } catch (const Unsupported& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'bert'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("BertForMaskedLM"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3, qwen3_moe"),
              std::string::npos)
        << msg;
  }
}

TEST(Config, MalformedFieldsNameTheField) {
  nlohmann::json j = {{"model_type", "llama"}, {"vocab_size", "many"}};
  EXPECT_THROW(
      {
        try {
          parse_model_config(j, "config.json");
        } catch (const FormatError& e) {
          EXPECT_NE(std::string(e.what()).find("'vocab_size' is \"many\""), std::string::npos);
          throw;
        }
      },
      FormatError);
  nlohmann::json scaled = {{"model_type", "llama"},
                           {"vocab_size", 16},
                           {"hidden_size", 8},
                           {"intermediate_size", 16},
                           {"num_hidden_layers", 1},
                           {"num_attention_heads", 2},
                           {"rope_scaling", {{"rope_type", "longrope"}}}};
  EXPECT_THROW(parse_model_config(scaled, "config.json"), Unsupported);
  scaled["rope_scaling"] = nullptr;
  scaled["num_key_value_heads"] = 3;
  EXPECT_THROW(parse_model_config(scaled, "config.json"), FormatError);
}

TEST(Config, IntegersOutsideTheirFieldsRangeAreFormatErrors) {
  const nlohmann::json good = nlohmann::json::parse(std::ifstream(fixture("hf-tiny/llama/config.json")));
  EXPECT_NO_THROW(parse_model_config(good, "config.json"));
  const std::pair<const char*, nlohmann::json> cases[] = {
      {"num_hidden_layers", (int64_t(1) << 32) + 6},  // would wrap to 6
      {"vocab_size", int64_t(1) << 31},
      {"hidden_size", -64},
      {"eos_token_id", int64_t(1) << 40},  // would wrap to 0
      {"eos_token_id", nlohmann::json::array({1, int64_t(1) << 40})},
      {"bos_token_id", -1},
      {"max_position_embeddings", 1e300},
      {"num_attention_heads", 18446744073709551615ull},
  };
  for (const auto& [key, value] : cases) {
    nlohmann::json j = good;
    j[key] = value;
    try {
      parse_model_config(j, "config.json");
      ADD_FAILURE() << key << "=" << value.dump() << ": no error";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  // sliding_window 2^40 (would wrap to 0) on a sliding layer.
  nlohmann::json sliding = good;
  sliding["layer_types"] = {"sliding_attention", "full_attention"};
  sliding["sliding_window"] = int64_t(1) << 40;
  EXPECT_THROW(parse_model_config(sliding, "config.json"), FormatError);
  sliding["sliding_window"] = 8;
  EXPECT_EQ(parse_model_config(sliding, "config.json").sliding_window, (std::vector<int>{8, 0}));
}

// A copy of the hf-tiny llama config in a temp dir, with one field replaced by raw JSON text.
class EditedConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("turbokv_config_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    for (const char* f : {"config.json", "generation_config.json"}) {
      std::filesystem::copy_file(fixture(std::string("hf-tiny/llama/") + f), dir_ / f);
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Rewrites file with `"key": raw_value` in place of the key's value.
  void set_raw(const char* file, const std::string& key, const std::string& raw_value) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir_ / file));
    j[key] = "@@";
    std::string text = j.dump();
    text.replace(text.find("\"@@\""), 4, raw_value);
    std::ofstream(dir_ / file) << text;
  }
  // The message of the FormatError that loading must throw.
  std::string load_error() {
    try {
      load_model_config(dir_.string());
    } catch (const FormatError& e) {
      return e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong error type: " << e.what();
      return "";
    }
    ADD_FAILURE() << "no error";
    return "";
  }

  std::filesystem::path dir_;
};

std::string nested(size_t depth) {
  return std::string(depth, '[') + "1" + std::string(depth, ']');
}

TEST_F(EditedConfig, DeeplyNestedFieldsAreFormatErrors) {
  for (const char* key : {"num_hidden_layers", "hidden_act", "eos_token_id", "vocab_size"}) {
    SetUp();
    set_raw("config.json", key, nested(100000));
    const std::string msg = load_error();
    EXPECT_NE(msg.find("config.json"), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("deeper than"), std::string::npos) << key << ": " << msg;
  }
  SetUp();
  set_raw("generation_config.json", "eos_token_id", nested(100000));
  const std::string msg = load_error();
  EXPECT_NE(msg.find("generation_config.json"), std::string::npos) << msg;
}

TEST(Config, NestedValuesWithinTheDepthLimitAreQuotedShort) {
  // Parsed by nlohmann directly (no depth limit): the error message must not walk the value.
  for (const char* key : {"num_hidden_layers", "hidden_act", "eos_token_id"}) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(fixture("hf-tiny/llama/config.json")));
    j[key] = nlohmann::json::parse(nested(100000));
    try {
      parse_model_config(j, "config.json");
      ADD_FAILURE() << key << ": no error";
    } catch (const FormatError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(key), std::string::npos) << msg;
      EXPECT_LT(msg.size(), 300u) << msg;
    }
  }
}

TEST(RopeScaling, DefaultAndLinear) {
  RopeConfig r;
  r.theta = 10000;
  const RopeTable plain = make_rope_table(r, 16, 1);
  ASSERT_EQ(plain.rotary_dim(), 16);
  EXPECT_FLOAT_EQ(plain.inv_freq[0], 1.0f);
  EXPECT_NEAR(plain.inv_freq[4], std::pow(10000.0, -0.5), 1e-7);
  r.type = "linear";
  r.factor = 4;
  const RopeTable linear = make_rope_table(r, 16, 1);
  for (int i = 0; i < 8; ++i)
    EXPECT_FLOAT_EQ(linear.inv_freq[size_t(i)], plain.inv_freq[size_t(i)] / 4);
  r.type = "default";
  r.partial_rotary_factor = 0.5;
  EXPECT_EQ(make_rope_table(r, 16, 1).rotary_dim(), 8);
}

// Llama 3.1's rope_scaling: high frequencies (wavelength < 8192/4) unchanged, low ones (> 8192)
// divided by 8, a smooth blend between.
TEST(RopeScaling, Llama3) {
  RopeConfig r;
  r.type = "llama3";
  r.theta = 500000;
  r.factor = 8;
  r.low_freq_factor = 1;
  r.high_freq_factor = 4;
  r.original_max_position_embeddings = 8192;
  RopeConfig base = r;
  base.type = "default";
  const RopeTable scaled = make_rope_table(r, 128, 1), plain = make_rope_table(base, 128, 1);
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi / plain.inv_freq[size_t(i)];
    if (wavelen < 2048) {
      EXPECT_FLOAT_EQ(scaled.inv_freq[size_t(i)], plain.inv_freq[size_t(i)]);
    }
    if (wavelen > 8192) {
      EXPECT_FLOAT_EQ(scaled.inv_freq[size_t(i)], plain.inv_freq[size_t(i)] / 8);
    }
    EXPECT_LE(scaled.inv_freq[size_t(i)], plain.inv_freq[size_t(i)] * 1.0000001f);
    EXPECT_GE(scaled.inv_freq[size_t(i)], plain.inv_freq[size_t(i)] / 8 * 0.9999999f);
  }
}

// YaRN factor 4: attention factor 0.1 ln 4 + 1; fastest dims extrapolate (unchanged), slowest
// interpolate (divided by the factor).
TEST(RopeScaling, YarnAndDynamic) {
  RopeConfig r;
  r.type = "yarn";
  r.theta = 1e6;
  r.factor = 4;
  r.original_max_position_embeddings = 32768;
  RopeConfig base = r;
  base.type = "default";
  const RopeTable yarn = make_rope_table(r, 128, 1), plain = make_rope_table(base, 128, 1);
  EXPECT_NEAR(yarn.attention_scaling, 0.1 * std::log(4.0) + 1, 1e-6);
  EXPECT_FLOAT_EQ(yarn.inv_freq[0], plain.inv_freq[0]);
  EXPECT_FLOAT_EQ(yarn.inv_freq[63], plain.inv_freq[63] / 4);

  r.type = "dynamic";
  r.factor = 2;
  r.original_max_position_embeddings = 100;
  const RopeTable short_seq = make_rope_table(r, 16, 100), long_seq = make_rope_table(r, 16, 400);
  RopeConfig unscaled;
  unscaled.theta = 1e6;
  EXPECT_EQ(short_seq.inv_freq, make_rope_table(unscaled, 16, 1).inv_freq);
  // base' = base * (2 * 400 / 100 - 1)^(16/14)
  const double theta = 1e6 * std::pow(7.0, 16.0 / 14.0);
  EXPECT_NEAR(long_seq.inv_freq[1], std::pow(theta, -2.0 / 16), 1e-7);
}

}  // namespace
}  // namespace turbokv
