// DeviceBlockPool (device_pool.h).
#include "kv/cuda/device_pool.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.h"

namespace turbokv::cuda {
namespace {

// Chunks kept out of reservations: each block size in use may hold one partly used chunk.
constexpr size_t kMarginChunks = 4;

}  // namespace

void DeviceBlockPool::init_chunks(size_t bytes) {
  chunks_ = std::max<size_t>(1, bytes / kChunkBytes);
  chunk_info_.resize(chunks_);
  for (size_t i = chunks_; i-- > 0;) free_chunks_.push_back(i);
}

DeviceBlockPool::DeviceBlockPool(void* memory, size_t bytes) {
  if (bytes < kChunkBytes) {
    throw InvalidArgument(str_cat("DeviceBlockPool: ", bytes, " B is less than one chunk"));
  }
  base_ = static_cast<uint8_t*>(memory);
  init_chunks(bytes);
}

DeviceBlockPool::DeviceBlockPool(size_t bytes) {
  init_chunks(bytes);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, chunks_ * kChunkBytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw PoolExhausted(str_cat("the KV cache pool of ", chunks_ * kChunkBytes / (1 << 20),
                                " MiB does not fit in GPU memory (", free / (1 << 20), " of ",
                                total / (1 << 20), " MiB free); lower --kv-cache-gb"));
  }
  base_ = static_cast<uint8_t*>(p);
  owns_ = true;
}

DeviceBlockPool::~DeviceBlockPool() {
  if (owns_) cudaFree(base_);
  for (auto& [size, block] : zero_blocks_) cudaFree(block);
}

DeviceBlockPool::Chunk& DeviceBlockPool::chunk_of(const uint8_t* block) {
  const size_t index = size_t(block - base_) / kChunkBytes;
  if (block < base_ || index >= chunks_) {
    throw Error("DeviceBlockPool: a block that is not from this pool was released");
  }
  return chunk_info_[index];
}

uint8_t* DeviceBlockPool::allocate(size_t block_bytes) {
  if (block_bytes == 0 || block_bytes > kChunkBytes || block_bytes % 16 != 0) {
    throw InvalidArgument(str_cat("DeviceBlockPool: block of ", block_bytes,
                                  " B; need a multiple of 16 in 16..", kChunkBytes));
  }
  std::vector<size_t>& partial = partial_[block_bytes];
  if (partial.empty()) {
    if (free_chunks_.empty()) {
      throw PoolExhausted(str_cat("the KV cache pool (", chunks_ * kChunkBytes / (1 << 20),
                                  " MiB) is full"));
    }
    const size_t index = free_chunks_.back();
    free_chunks_.pop_back();
    Chunk& c = chunk_info_[index];
    c.block_bytes = block_bytes;
    c.used = 0;
    const size_t n = kChunkBytes / block_bytes;
    c.free_blocks.clear();
    for (size_t b = n; b-- > 0;) c.free_blocks.push_back(chunk_base(index) + b * block_bytes);
    partial.push_back(index);
  }
  Chunk& c = chunk_info_[partial.back()];
  uint8_t* block = c.free_blocks.back();
  c.free_blocks.pop_back();
  ++c.used;
  if (c.free_blocks.empty()) partial.pop_back();
  used_bytes_ += block_bytes;
  ++blocks_in_use_;
  return block;
}

void DeviceBlockPool::retain(uint8_t* block) {
  const Chunk& c = chunk_of(block);
  if (c.block_bytes == 0) throw Error("DeviceBlockPool: retain of a block that is not allocated");
  ++extra_references_[block];
}

int DeviceBlockPool::references(const uint8_t* block) const {
  const size_t index = size_t(block - base_) / kChunkBytes;
  if (block < base_ || index >= chunks_ || chunk_info_[index].block_bytes == 0) return 0;
  auto it = extra_references_.find(block);
  return 1 + (it == extra_references_.end() ? 0 : it->second);
}

void DeviceBlockPool::release(uint8_t* block, size_t block_bytes) {
  if (auto it = extra_references_.find(block); it != extra_references_.end()) {
    if (--it->second == 0) extra_references_.erase(it);
    return;
  }
  Chunk& c = chunk_of(block);
  if (c.block_bytes != block_bytes || c.used <= 0) {
    throw Error(str_cat("DeviceBlockPool: released a block of ", block_bytes,
                        " B into a chunk of ", c.block_bytes, " B blocks"));
  }
  const size_t index = size_t(block - base_) / kChunkBytes;
  std::vector<size_t>& partial = partial_[block_bytes];
  if (c.free_blocks.empty()) partial.push_back(index);
  c.free_blocks.push_back(block);
  --c.used;
  used_bytes_ -= block_bytes;
  --blocks_in_use_;
  if (c.used == 0) {  // the chunk goes back to the pool for any block size
    partial.erase(std::find(partial.begin(), partial.end(), index));
    c.block_bytes = 0;
    c.free_blocks.clear();
    free_chunks_.push_back(index);
  }
}

const uint8_t* DeviceBlockPool::zero_block(size_t block_bytes) {
  auto it = zero_blocks_.find(block_bytes);
  if (it != zero_blocks_.end()) return it->second;
  void* p = nullptr;
  TURBOKV_CUDA_CHECK(cudaMalloc(&p, block_bytes));
  TURBOKV_CUDA_CHECK(cudaMemset(p, 0, block_bytes));
  TURBOKV_CUDA_CHECK(cudaDeviceSynchronize());
  zero_blocks_[block_bytes] = static_cast<uint8_t*>(p);
  return static_cast<uint8_t*>(p);
}

size_t DeviceBlockPool::bytes_for_blocks(int64_t blocks, size_t block_bytes) {
  if (blocks <= 0) return 0;
  const size_t per_chunk = kChunkBytes / block_bytes;
  // A block costs its share of a chunk (the chunk's unusable tail included).
  return size_t(blocks) * (kChunkBytes / per_chunk);
}

size_t DeviceBlockPool::promisable_bytes() const {
  return (chunks_ > kMarginChunks ? chunks_ - kMarginChunks : 1) * kChunkBytes;
}

bool DeviceBlockPool::reserve(size_t bytes) {
  if (reserved_bytes_ + bytes > promisable_bytes()) return false;
  reserved_bytes_ += bytes;
  return true;
}

void DeviceBlockPool::unreserve(size_t bytes) {
  reserved_bytes_ -= std::min(bytes, reserved_bytes_);
}

PoolStats DeviceBlockPool::stats() const {
  PoolStats s;
  s.capacity_bytes = chunks_ * kChunkBytes;
  s.used_bytes = used_bytes_;
  s.reserved_bytes = reserved_bytes_;
  s.promisable_bytes = promisable_bytes();
  s.blocks_in_use = blocks_in_use_;
  s.chunks_total = int64_t(chunks_);
  s.chunks_in_use = int64_t(chunks_ - free_chunks_.size());
  return s;
}

}  // namespace turbokv::cuda
