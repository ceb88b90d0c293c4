#include "kv/packed_rows.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kv/byte_io.h"

namespace turbokv {

PackedRows::PackedRows(int kv_heads, size_t code_bytes, int aux_per_vector)
    : kv_heads_(kv_heads), code_bytes_(code_bytes), aux_(aux_per_vector) {}

int64_t PackedRows::grow(int64_t n) {
  const int64_t first = rows_;
  if (rows_ + n > capacity_) {
    const int64_t new_capacity = (rows_ + n + kCapacityStep - 1) / kCapacityStep * kCapacityStep;
    std::vector<uint8_t> codes(size_t(kv_heads_) * new_capacity * code_bytes_ + kCodePadding);
    std::vector<uint16_t> aux(size_t(kv_heads_) * new_capacity * aux_);
    for (int h = 0; h < kv_heads_ && rows_ > 0; ++h) {
      std::memcpy(codes.data() + h * new_capacity * code_bytes_,
                  codes_.data() + h * capacity_ * code_bytes_, rows_ * code_bytes_);
      std::copy_n(aux_words_.data() + h * capacity_ * aux_, rows_ * aux_,
                  aux.data() + h * new_capacity * aux_);
    }
    codes_.swap(codes);
    aux_words_.swap(aux);
    capacity_ = new_capacity;
  }
  rows_ += n;
  return first;
}

void PackedRows::write(ByteWriter& out, int64_t first, int64_t n) const {
  for (int h = 0; h < kv_heads_; ++h) out.bytes(codes(h, first), n * code_bytes_);
  for (int h = 0; h < kv_heads_; ++h) out.bytes(aux(h, first), n * aux_ * sizeof(uint16_t));
}

void PackedRows::read_append(ByteReader& in, int64_t n) {
  if (n < 0 || static_cast<uint64_t>(n) * row_record_bytes() > in.remaining()) {
    throw FormatError(str_cat("cache file is truncated: ", n, " tokens do not fit in the ",
                              in.remaining(), " bytes left"));
  }
  const int64_t first = grow(n);
  for (int h = 0; h < kv_heads_; ++h) in.bytes(codes(h, first), n * code_bytes_, "codes");
  for (int h = 0; h < kv_heads_; ++h) {
    in.bytes(aux(h, first), n * aux_ * sizeof(uint16_t), "norms and scales");
  }
}

}  // namespace turbokv
