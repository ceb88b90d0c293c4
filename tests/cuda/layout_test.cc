// The device tile format: conversion to and from the CPU codec's LSB-first codes (host only,
// runs without a GPU).
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "kernels/cuda/tq_layout.h"
#include "quant/bitpack.h"

namespace turbokv::cuda {
namespace {

TQHostCodes random_codes(int tokens, uint64_t seed, int key_bits = 3, int value_bits = 4) {
  std::mt19937_64 rng(seed);
  TQHostCodes c;
  c.tokens = tokens;
  c.key_bits = key_bits;
  c.value_bits = value_bits;
  c.key_codes.resize(size_t(tokens) * 16 * key_bits);
  c.value_codes.resize(size_t(tokens) * 16 * value_bits);
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

constexpr int kBitPairs[][2] = {{3, 4}, {4, 3}, {4, 4}, {3, 3}, {2, 3}, {3, 2}, {2, 2}, {2, 4}, {4, 2}};

TEST(CudaLayout, EveryBitPairRoundTripsToCpuCodes) {
  for (const auto& [kb, vb] : kBitPairs) {
    const TQTileLayout lay{kb, vb};
    EXPECT_EQ(lay.tile_bytes(), 32 * (16 * (kb + vb) + 4));
    for (int tokens : {1, 33, 64}) {
      const TQHostCodes codes = random_codes(tokens, 11 + tokens + 10 * kb + vb, kb, vb);
      const std::vector<uint8_t> tiles = tq_tiles_from_codes(codes);
      ASSERT_EQ(tiles.size(), size_t((tokens + 31) / 32) * lay.tile_bytes());
      const TQHostCodes back = tq_codes_from_tiles(tiles.data(), tokens, kb, vb);
      EXPECT_EQ(back.key_codes, codes.key_codes) << kb << "/" << vb << " " << tokens;
      EXPECT_EQ(back.value_codes, codes.value_codes) << kb << "/" << vb << " " << tokens;
      EXPECT_EQ(back.key_norms, codes.key_norms);
      EXPECT_EQ(back.value_norms, codes.value_norms);
    }
    // Every bit of a full tile has exactly one home: all-ones codes fill every byte.
    TQHostCodes ones;
    ones.tokens = 32;
    ones.key_bits = kb;
    ones.value_bits = vb;
    ones.key_codes.assign(size_t(32) * 16 * kb, 0xff);
    ones.value_codes.assign(size_t(32) * 16 * vb, 0xff);
    ones.key_norms.assign(32, 0xffff);
    ones.value_norms.assign(32, 0xffff);
    const std::vector<uint8_t> full = tq_tiles_from_codes(ones);
    for (size_t i = 0; i < full.size(); ++i) ASSERT_EQ(full[i], 0xff) << kb << "/" << vb << " byte " << i;
  }
}

// K4/V3's value placement (tq_layout.h): value of token 3, dim 21 is lane 4*(21%8) + 3/2 = 21,
// operand group 8*0 + 21/16 = 1, pair 2*0 + (21%16)/8 = 0, the high code of the pair (token
// 3 is odd): bit 24*1 + 6*0 + 3 = 27 of the lane's value record (word 0), 3 bits.
TEST(CudaLayout, ValuePlacementOfThreeBitsMatchesTheDocumentedFormula) {
  TQHostCodes codes = random_codes(32, 5, 4, 3);
  std::fill(codes.value_codes.begin(), codes.value_codes.end(), 0);
  uint8_t idx[128] = {};
  idx[21] = 5;  // 0b101
  quant::pack_codes(idx, 128, 3, codes.value_codes.data() + 3 * 48);
  const std::vector<uint8_t> tiles = tq_tiles_from_codes(codes);
  const TQTileLayout lay{4, 3};
  const int word_offset = TQTileLayout::lane_word_offset(lay.value_offset(), 21, 0);
  EXPECT_EQ(word_offset, 2048 + 16 * 21);
  for (int i = lay.value_offset(); i < lay.norms_offset(); ++i) {
    // bits 27..29 of the word = 0b101: byte 3 bits 3 and 5.
    const uint8_t expected = i == word_offset + 3 ? 0x28 : 0;
    ASSERT_EQ(tiles[size_t(i)], expected) << "byte " << i;
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
  TQHostCodes wide = random_codes(3, 2, 5, 4);
  EXPECT_THROW(tq_tiles_from_codes(wide), InvalidArgument);
  EXPECT_THROW(tq_codes_from_tiles(nullptr, 0, 4, 1), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::cuda
