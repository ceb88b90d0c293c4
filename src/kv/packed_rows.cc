#include "kv/packed_rows.h"

#include <algorithm>
#include <cstring>

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

}  // namespace turbokv
