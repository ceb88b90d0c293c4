// Growable head-major storage of coded vectors for the quantized caches: per KV head and
// token, code_bytes bytes of packed codes and aux_per_vector fp16 words (norms, or a uniform
// group's scale and min). Capacity grows in steps of kCapacityStep tokens. The code buffer
// keeps kCodePadding spare bytes so SIMD decoders may load 4 bytes at the last group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace turbokv {

class ByteWriter;
class ByteReader;

class PackedRows {
 public:
  static constexpr int64_t kCapacityStep = 256;
  static constexpr size_t kCodePadding = 4;

  PackedRows(int kv_heads, size_t code_bytes, int aux_per_vector);

  int64_t rows() const { return rows_; }
  int64_t capacity() const { return capacity_; }
  size_t code_bytes() const { return code_bytes_; }
  int aux_per_vector() const { return aux_; }
  // Bytes of the rows held: codes + 2 bytes per aux word.
  size_t nbytes() const { return size_t(rows_) * kv_heads_ * (code_bytes_ + 2 * size_t(aux_)); }

  // Makes room for n more rows; returns the index of the first new row.
  int64_t grow(int64_t n);
  void drop_newest(int64_t n) { rows_ -= n; }

  // Serialization (KVCache::write_rows): rows [first, first + n) as every head's codes, then
  // every head's aux words. The caller checks the range.
  void write(ByteWriter& out, int64_t first, int64_t n) const;
  // Appends n rows recorded by write(); FormatError when the data ends first.
  void read_append(ByteReader& in, int64_t n);
  // Bytes write() records per row.
  size_t row_record_bytes() const { return size_t(kv_heads_) * (code_bytes_ + 2 * size_t(aux_)); }

  uint8_t* codes(int h, int64_t t) { return codes_.data() + (h * capacity_ + t) * code_bytes_; }
  const uint8_t* codes(int h, int64_t t) const {
    return codes_.data() + (h * capacity_ + t) * code_bytes_;
  }
  uint16_t* aux(int h, int64_t t) { return aux_words_.data() + (h * capacity_ + t) * aux_; }
  const uint16_t* aux(int h, int64_t t) const {
    return aux_words_.data() + (h * capacity_ + t) * aux_;
  }

 private:
  int kv_heads_;
  size_t code_bytes_;
  int aux_;
  int64_t rows_ = 0;
  int64_t capacity_ = 0;
  std::vector<uint8_t> codes_;       // [kv_heads, capacity, code_bytes] + kCodePadding
  std::vector<uint16_t> aux_words_;  // [kv_heads, capacity, aux_per_vector]
};

}  // namespace turbokv
