// Growable head-major K/V storage shared by DenseKVCache and RotatingKVCache. Input rows come
// in token-major ([n, kv_heads, head_dim], fp32) and are stored per head so that attention
// streams one KV head's tokens contiguously. Capacity grows in steps of kCapacityStep tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/attention.h"

namespace turbokv {

class ByteWriter;
class ByteReader;

class DenseRows {
 public:
  static constexpr int64_t kCapacityStep = 256;

  DenseRows(KVDType dtype, int kv_heads, int head_dim);

  KVDType dtype() const { return dtype_; }
  int64_t rows() const { return rows_; }
  int64_t capacity() const { return capacity_; }
  // Bytes of the rows held (keys and values), not of the reserved capacity.
  size_t nbytes() const;

  // k, v: [n, kv_heads, head_dim] fp32, converted to dtype().
  void append(const float* k, const float* v, int64_t n);
  void drop_newest(int64_t n);
  // Moves the kept rows to the front of every head (a copy of rows() - n rows per head).
  void drop_oldest(int64_t n);

  DenseKVView view(int64_t first_pos) const;

  // Serialization (KVCache::write_rows): rows [first, first + n) as every head's keys, then
  // every head's values. The caller checks the range.
  void write(ByteWriter& out, int64_t first, int64_t n) const;
  // Appends n rows recorded by write(); FormatError when the data ends first.
  void read_append(ByteReader& in, int64_t n);
  // Rows [first, first + n) as f32 into k, v [n, kv_heads, head_dim].
  void read_f32(int64_t first, int64_t n, float* k, float* v) const;

  // Raw storage of head h: rows() * head_dim elements of dtype().
  const uint8_t* key_head(int h) const;
  const uint8_t* value_head(int h) const;
  size_t row_bytes() const;  // one token of one head, keys or values alone

 private:
  void reserve(int64_t rows);

  KVDType dtype_;
  int kv_heads_;
  int head_dim_;
  int64_t rows_ = 0;
  int64_t capacity_ = 0;
  std::vector<uint8_t> keys_;    // [kv_heads, capacity, head_dim] elements of dtype
  std::vector<uint8_t> values_;  // [kv_heads, capacity, head_dim] elements of dtype
};

}  // namespace turbokv
