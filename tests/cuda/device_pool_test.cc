// DeviceBlockPool's bookkeeping over host memory (no GPU needed): chunks serve one block size
// at a time and go back to the pool when their last block is released; reservations stop at
// the budget; blocks never overlap. Also the device formats' host-side refusals.
#include "kv/cuda/device_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/cuda/device_formats.h"

namespace turbokv::cuda {
namespace {

constexpr size_t kChunk = DeviceBlockPool::kChunkBytes;

TEST(DeviceBlockPool, ChunksServeOneBlockSizeAndReturnWhenEmpty) {
  std::vector<uint8_t> memory(3 * kChunk);
  DeviceBlockPool pool(memory.data(), memory.size());
  EXPECT_EQ(pool.stats().chunks_total, 3);
  const size_t big = kChunk / 2, small = 4096;
  uint8_t* a = pool.allocate(big);
  uint8_t* b = pool.allocate(big);  // same chunk as a
  uint8_t* c = pool.allocate(small);
  EXPECT_EQ(pool.stats().chunks_in_use, 2);
  EXPECT_EQ(pool.stats().blocks_in_use, 3);
  EXPECT_EQ(pool.stats().used_bytes, 2 * big + small);
  EXPECT_NE(a, b);
  EXPECT_EQ(size_t(std::max(a, b) - std::min(a, b)), big);
  uint8_t* d = pool.allocate(big);  // a third chunk
  uint8_t* f = pool.allocate(big);  // fills it
  EXPECT_EQ(pool.stats().chunks_in_use, 3);
  EXPECT_THROW(pool.allocate(big), PoolExhausted);
  pool.release(c, small);  // its chunk is free again, for any size
  EXPECT_EQ(pool.stats().chunks_in_use, 2);
  uint8_t* e = pool.allocate(big);
  EXPECT_EQ(pool.stats().chunks_in_use, 3);
  for (uint8_t* p : {a, b, d, e, f}) pool.release(p, big);
  EXPECT_EQ(pool.stats().chunks_in_use, 0);
  EXPECT_EQ(pool.stats().used_bytes, 0u);
}

TEST(DeviceBlockPool, BlocksOfOneSizeNeverOverlap) {
  std::vector<uint8_t> memory(2 * kChunk);
  DeviceBlockPool pool(memory.data(), memory.size());
  const size_t size = 237568;  // a TurboQuant 3.5 block of 8 KV heads
  std::vector<uint8_t*> blocks;
  try {
    for (;;) blocks.push_back(pool.allocate(size));
  } catch (const PoolExhausted&) {
  }
  EXPECT_EQ(blocks.size(), 2 * (kChunk / size));
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) EXPECT_GE(size_t(blocks[i] - blocks[i - 1]), size);
  EXPECT_GE(blocks.front(), memory.data());
  EXPECT_LE(blocks.back() + size, memory.data() + memory.size());
  EXPECT_THROW(pool.release(memory.data() + memory.size() + 64, size), Error);
  EXPECT_THROW(pool.allocate(kChunk + 16), InvalidArgument);
  EXPECT_THROW(pool.allocate(100), InvalidArgument);  // not a multiple of 16
}

TEST(DeviceBlockPool, SharedBlocksGoBackWithTheirLastReference) {
  std::vector<uint8_t> memory(2 * kChunk);
  DeviceBlockPool pool(memory.data(), memory.size());
  uint8_t* a = pool.allocate(4096);
  pool.retain(a);
  pool.retain(a);
  EXPECT_EQ(pool.references(a), 3);
  pool.release(a, 4096);
  pool.release(a, 4096);
  EXPECT_EQ(pool.references(a), 1);
  EXPECT_EQ(pool.stats().blocks_in_use, 1);
  pool.release(a, 4096);
  EXPECT_EQ(pool.references(a), 0);
  EXPECT_EQ(pool.stats().chunks_in_use, 0);
  EXPECT_THROW(pool.retain(a), Error);
}

TEST(DeviceBlockPool, ReservationsStopAtTheBudget) {
  std::vector<uint8_t> memory(8 * kChunk);
  DeviceBlockPool pool(memory.data(), memory.size());
  // Four chunks are kept back for partly used chunks of each block size.
  EXPECT_TRUE(pool.reserve(3 * kChunk));
  EXPECT_FALSE(pool.reserve(2 * kChunk));
  EXPECT_TRUE(pool.reserve(kChunk));
  pool.unreserve(4 * kChunk);
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_EQ(DeviceBlockPool::bytes_for_blocks(3, kChunk / 3 + 16), 3 * kChunk / 2);
}

}  // namespace
}  // namespace turbokv::cuda
