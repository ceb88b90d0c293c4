// JSON reading helpers: the nesting limit that keeps recursive walks off deep documents, and the
// short excerpts error messages quote.
#include "core/text_file.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace turbokv {
namespace {

// "[[[...inner...]]]" nested depth times.
std::string nested(size_t depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

TEST(JsonDepth, FindsTheFirstBracketPastTheLimit) {
  EXPECT_EQ(find_json_depth_excess(nested(3), 3), std::string_view::npos);
  EXPECT_EQ(find_json_depth_excess(nested(4), 3), 3u);
  EXPECT_EQ(find_json_depth_excess(R"({"a": [{"b": []}]})", 4), std::string_view::npos);
  EXPECT_EQ(find_json_depth_excess(R"({"a": [{"b": [[]]}]})", 4), 14u);
  // Brackets inside strings, escaped quotes included, do not nest.
  EXPECT_EQ(find_json_depth_excess(R"(["[[[[\"[[[[", 1])", 1), std::string_view::npos);
  // Sequential arrays do not add up.
  EXPECT_EQ(find_json_depth_excess("[[1],[2],[3],[4]]", 2), std::string_view::npos);
}

TEST(JsonDepth, ParseRefusesDeepNestingWithItsLocation) {
  const std::string deep = R"({"vocab_size": )" + nested(100000) + "}";
  try {
    parse_json_located<nlohmann::json>(deep, "config.json");
    FAIL() << "no error";
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("deeper than 256"), std::string::npos) << msg;
    EXPECT_NE(msg.find("byte 270"), std::string::npos) << msg;  // the 256th [ inside {
  }
  EXPECT_THROW(parse_json_located<nlohmann::ordered_json>(deep, "vars.json"), FormatError);
  // Up to the limit parses.
  const auto ok = parse_json_located<nlohmann::json>(nested(kMaxJsonDepth), "x");
  EXPECT_TRUE(ok.is_array());
}

// nlohmann reports a number past double (1e999) as out_of_range, not parse_error: still a
// FormatError naming the file and the number.
TEST(JsonParse, NumberOverflowIsAFormatError) {
  for (const char* text : {R"({"vocab_size": 1e999})", "[-111e308]"}) {
    try {
      parse_json_located<nlohmann::json>(text, "tokenizer.json");
      FAIL() << "no error for " << text;
    } catch (const FormatError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("tokenizer.json: malformed JSON"), std::string::npos) << msg;
      EXPECT_NE(msg.find("number overflow"), std::string::npos) << msg;
    }
    EXPECT_THROW(parse_json_located<nlohmann::ordered_json>(text, "vars.json"), FormatError);
  }
}

TEST(JsonExcerpt, ShortAndBoundedForAnyValue) {
  EXPECT_EQ(json_excerpt(nlohmann::json("many")), "\"many\"");
  EXPECT_EQ(json_excerpt(nlohmann::json::parse(R"({"a": [1, 2]})")), R"({"a": [1, 2]})");
  EXPECT_EQ(json_excerpt(nlohmann::json::parse(nested(6))), "[[[[[...]]]]]");
  // nlohmann's own parser takes any depth: the excerpt must not recurse through all of it.
  const auto deep = nlohmann::json::parse(nested(100000));
  EXPECT_EQ(json_excerpt(deep), "[[[[[...]]]]]");
  const std::string long_text(100000, 'x');
  const std::string e = json_excerpt(nlohmann::json(long_text), 20);
  EXPECT_EQ(e, "\"" + std::string(19, 'x') + "...");
  nlohmann::json many = nlohmann::json::array();
  for (int i = 0; i < 10000; ++i) many.push_back(i);
  EXPECT_LE(json_excerpt(many, 30).size(), 33u);
  // A cut never splits a UTF-8 character.
  std::string e_acute;
  for (int i = 0; i < 40; ++i) e_acute += "\xC3\xA9";
  for (size_t limit = 5; limit < 15; ++limit) {
    const std::string cut = json_excerpt(nlohmann::json(e_acute), limit);
    EXPECT_NO_THROW(nlohmann::json(cut).dump()) << limit;  // throws on invalid UTF-8
  }
}

}  // namespace
}  // namespace turbokv
