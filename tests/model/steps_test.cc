// How forward passes cut chunks into steps (model/model.h): split_into_steps fills every step,
// split_into_whole_steps cuts a chunk only at multiples of the step size from its own start.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "model/model.h"

namespace turbokv {
namespace {

using Cut = std::vector<std::vector<std::pair<int, int>>>;  // per step: (begin, count) per slice

Cut cut_of(const std::vector<std::vector<ChunkSlice>>& steps) {
  Cut cut;
  for (const auto& step : steps) {
    cut.emplace_back();
    for (const ChunkSlice& s : step) cut.back().push_back({s.begin, s.count});
  }
  return cut;
}

std::vector<Model::Chunk> chunks_of(const std::vector<int>& sizes) {
  std::vector<Model::Chunk> chunks(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) chunks[i].n_tokens = sizes[i];
  return chunks;
}

TEST(Steps, SplitIntoStepsFillsEachStep) {
  const auto chunks = chunks_of({1, 300, 400});
  EXPECT_EQ(cut_of(split_into_steps(chunks, 512)),
            (Cut{{{0, 1}, {0, 300}, {0, 211}}, {{211, 189}}}));
}

// A chunk's pieces are the same whatever comes before it in the batch.
TEST(Steps, WholeStepsCutAChunkAtItsOwnMultiples) {
  const auto alone = chunks_of({1200});
  const Cut expected_alone = {{{0, 512}}, {{512, 512}}, {{1024, 176}}};
  EXPECT_EQ(cut_of(split_into_whole_steps(alone, 512)), expected_alone);
  const auto batch = chunks_of({1, 300, 1200, 5});
  EXPECT_EQ(cut_of(split_into_whole_steps(batch, 512)),
            (Cut{{{0, 1}, {0, 300}}, {{0, 512}}, {{512, 512}}, {{1024, 176}, {0, 5}}}));
  EXPECT_TRUE(split_into_whole_steps(chunks_of({}), 512).empty());
}

}  // namespace
}  // namespace turbokv
