// The device tile format: conversion to and from the CPU codec's LSB-first codes (host only,
// runs without a GPU).
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "kernels/cuda/tq_layout.h"
#include "quant/bitpack.h"

namespace turbokv::cuda {
namespace {

TQHostCodes random_codes(int tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  TQHostCodes c;
  c.tokens = tokens;
  c.key_codes.resize(size_t(tokens) * 48);
  c.value_codes.resize(size_t(tokens) * 64);
  for (auto& x : c.key_codes) x = uint8_t(rng());
  for (auto& x : c.value_codes) x = uint8_t(rng());
  for (int t = 0; t < tokens; ++t) {
    c.key_norms.push_back(uint16_t(rng()));
    c.value_norms.push_back(uint16_t(rng()));
  }
  return c;
}

TEST(CudaLayout, TilesRoundTripToCpuCodes) {
  for (int tokens : {1, 31, 32, 33, 100}) {
    const TQHostCodes codes = random_codes(tokens, 7 + tokens);
    const std::vector<uint8_t> tiles = tq_tiles_from_codes(codes);
    ASSERT_EQ(tiles.size(), size_t((tokens + 31) / 32) * TQ35Layout::kTileBytes);
    const TQHostCodes back = tq_codes_from_tiles(tiles.data(), tokens);
    EXPECT_EQ(back.key_codes, codes.key_codes) << tokens;
    EXPECT_EQ(back.value_codes, codes.value_codes) << tokens;
    EXPECT_EQ(back.key_norms, codes.key_norms) << tokens;
    EXPECT_EQ(back.value_norms, codes.value_norms) << tokens;
  }
}

// Every code bit of a full tile has exactly one home: 32 tokens fill all 3712 bytes.
TEST(CudaLayout, FullTileUsesEveryByteOnce) {
  TQHostCodes ones;
  ones.tokens = 32;
  ones.key_codes.assign(32 * 48, 0xff);
  ones.value_codes.assign(32 * 64, 0xff);
  ones.key_norms.assign(32, 0xffff);
  ones.value_norms.assign(32, 0xffff);
  const std::vector<uint8_t> tiles = tq_tiles_from_codes(ones);
  for (size_t i = 0; i < tiles.size(); ++i) ASSERT_EQ(tiles[i], 0xff) << "byte " << i;
}

// Spot check of the documented placement (tq_layout.h): key of token 9, dim 37 is lane 5,
// slot 1, bits 96 + 15 .. 96 + 17 of the lane record = word 3 bits 15..17.
TEST(CudaLayout, KeyPlacementMatchesTheDocumentedFormula) {
  TQHostCodes codes = random_codes(32, 1);
  std::fill(codes.key_codes.begin(), codes.key_codes.end(), 0);
  uint8_t idx[128] = {};
  idx[37] = 5;
  quant::pack_codes(idx, 128, 3, codes.key_codes.data() + 9 * 48);
  const std::vector<uint8_t> tiles = tq_tiles_from_codes(codes);
  const int word_offset = TQ35Layout::lane_word_offset(0, 5, 3);
  EXPECT_EQ(word_offset, 16 * 5 + 12);
  for (int i = 0; i < TQ35Layout::kKeyBytes; ++i) {
    const uint8_t expected = i == word_offset + 1 ? 0x80 : i == word_offset + 2 ? 0x02 : 0;
    ASSERT_EQ(tiles[i], expected) << "byte " << i;
  }
}

TEST(CudaLayout, RejectsMismatchedArrays) {
  TQHostCodes codes = random_codes(3, 2);
  codes.value_codes.pop_back();
  EXPECT_THROW(tq_tiles_from_codes(codes), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::cuda
