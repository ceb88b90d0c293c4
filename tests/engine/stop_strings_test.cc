// Stop strings: nothing of a stop string is ever released while streaming.
#include "engine/stop_strings.h"

#include <gtest/gtest.h>

namespace turbokv {
namespace {

// Feeds pieces one by one; returns the released text and whether a stop string matched.
std::pair<std::string, bool> run(std::vector<std::string> stops, std::vector<std::string> pieces) {
  StopStringMatcher m(std::move(stops));
  std::string out;
  for (const auto& p : pieces) {
    bool stopped = false;
    out += m.push(p, &stopped);
    if (stopped) return {out, true};
  }
  out += m.flush();
  return {out, false};
}

TEST(StopStrings, CutsBeforeAMatchSpanningPieces) {
  EXPECT_EQ(run({"END"}, {"Hel", "lo E", "N", "D tail"}),
            std::make_pair(std::string("Hello "), true));
}

TEST(StopStrings, HoldsBackAPossiblePrefixThenReleasesIt) {
  StopStringMatcher m({"END"});
  bool stopped = false;
  EXPECT_EQ(m.push("abE", &stopped), "ab");
  EXPECT_EQ(m.push("N", &stopped), "");
  EXPECT_EQ(m.push("x", &stopped), "ENx");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.push("E", &stopped), "");
  EXPECT_EQ(m.flush(), "E");
  EXPECT_EQ(m.released(), "abENxE");
}

TEST(StopStrings, EarliestMatchWins) {
  EXPECT_EQ(run({"world", "lo"}, {"hello world"}), std::make_pair(std::string("hel"), true));
}

TEST(StopStrings, NoStopsReleasesEverythingAtOnce) {
  StopStringMatcher m({});
  bool stopped = true;
  EXPECT_EQ(m.push("abc", &stopped), "abc");
  EXPECT_FALSE(stopped);
}

TEST(StopStrings, EmptyStopStringsAreIgnored) {
  EXPECT_EQ(run({""}, {"abc"}), std::make_pair(std::string("abc"), false));
}

}  // namespace
}  // namespace turbokv
