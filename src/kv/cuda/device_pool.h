// DeviceBlockPool: the GPU memory every device KV cache takes its blocks from. One cudaMalloc
// of the whole budget, carved into fixed chunks; a chunk serves blocks of one size (one cache
// format), and returns to the pool when its last block is released, so formats trade memory
// as requests come and go. Reservations let the engine admit a request only when the blocks
// it will need are there (kv/cuda/device_caches.h asks per request).
//
// Not thread-safe: the engine thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/error.h"

namespace turbokv::cuda {

// The pool cannot give what was asked (an Error: the request fails, the engine goes on).
class PoolExhausted : public Error {
 public:
  using Error::Error;
};

struct PoolStats {
  size_t capacity_bytes = 0;  // the budget
  size_t used_bytes = 0;      // bytes of blocks handed out
  size_t reserved_bytes = 0;  // promised to admitted requests (>= what they use so far)
  // The most that promises may total: all chunks but kMarginChunks, kept back because a chunk
  // holds blocks of one size only.
  size_t promisable_bytes = 0;
  int64_t blocks_in_use = 0;
  int64_t chunks_in_use = 0;
  int64_t chunks_total = 0;
};

class DeviceBlockPool {
 public:
  static constexpr size_t kChunkBytes = size_t(32) << 20;

  // Allocates `bytes` of device memory (rounded down to whole chunks, at least one). Throws
  // PoolExhausted when the device does not have them.
  explicit DeviceBlockPool(size_t bytes);
  // A pool over memory the caller owns (any address space: the tests use host memory); no
  // CUDA call is made except by zero_block().
  DeviceBlockPool(void* memory, size_t bytes);
  ~DeviceBlockPool();
  DeviceBlockPool(const DeviceBlockPool&) = delete;
  DeviceBlockPool& operator=(const DeviceBlockPool&) = delete;

  // A block of block_bytes (<= kChunkBytes, a multiple of 16), contents unspecified. Throws
  // PoolExhausted when no chunk is free.
  uint8_t* allocate(size_t block_bytes);
  // Releases one reference: the block goes back only when no reference is left.
  void release(uint8_t* block, size_t block_bytes);
  // Another reference to an allocated block (prefix sharing): it stays until every holder has
  // released it. Shared blocks are never written (the holders copy before writing).
  void retain(uint8_t* block);
  // References held on the block (0: not allocated).
  int references(const uint8_t* block) const;
  // A zero-filled block of block_bytes that is never handed out: what block tables point at
  // past a sequence's blocks.
  const uint8_t* zero_block(size_t block_bytes);

  // Bytes a cache of `tokens` tokens in blocks of block_bytes takes at most, chunk rounding
  // included (for admission).
  static size_t bytes_for_blocks(int64_t blocks, size_t block_bytes);
  // Promises bytes to a request: false (and nothing reserved) when the pool cannot keep the
  // promise next to the ones it made.
  bool reserve(size_t bytes);
  void unreserve(size_t bytes);
  // The most that promises may total (PoolStats::promisable_bytes).
  size_t promisable_bytes() const;

  PoolStats stats() const;

 private:
  struct Chunk {
    size_t block_bytes = 0;  // 0: free
    std::vector<uint8_t*> free_blocks;
    int64_t used = 0;
  };
  Chunk& chunk_of(const uint8_t* block);
  uint8_t* chunk_base(size_t index) const { return base_ + index * kChunkBytes; }

  void init_chunks(size_t bytes);

  uint8_t* base_ = nullptr;
  bool owns_ = false;
  size_t chunks_ = 0;
  std::vector<Chunk> chunk_info_;
  std::vector<size_t> free_chunks_;                     // indices
  std::map<size_t, std::vector<size_t>> partial_;       // block size -> chunks with free blocks
  std::map<size_t, uint8_t*> zero_blocks_;              // block size -> separate allocation
  std::map<const uint8_t*, int> extra_references_;      // shared blocks: references beyond one
  size_t used_bytes_ = 0, reserved_bytes_ = 0;
  int64_t blocks_in_use_ = 0;
};

}  // namespace turbokv::cuda
