#include "kv/dense_rows.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kv/byte_io.h"

namespace turbokv {
namespace {

void store_row(KVDType dtype, const float* src, int n, uint8_t* dst) {
  switch (dtype) {
    case KVDType::kF32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case KVDType::kF16: {
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) out[i] = f32_to_f16(src[i]);
      return;
    }
    case KVDType::kBF16: {
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) out[i] = f32_to_bf16(src[i]);
      return;
    }
  }
}

float load_element(KVDType dtype, const uint8_t* row, int i) {
  switch (dtype) {
    case KVDType::kF32:
      return reinterpret_cast<const float*>(row)[i];
    case KVDType::kF16:
      return f16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
    case KVDType::kBF16:
      return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
  }
  return 0;
}

}  // namespace

DenseRows::DenseRows(KVDType dtype, int kv_heads, int head_dim)
    : dtype_(dtype), kv_heads_(kv_heads), head_dim_(head_dim) {}

size_t DenseRows::row_bytes() const {
  return kv_dtype_bytes(dtype_) * head_dim_;
}

size_t DenseRows::nbytes() const {
  return 2 * row_bytes() * kv_heads_ * rows_;
}

void DenseRows::reserve(int64_t rows) {
  if (rows <= capacity_) return;
  const int64_t new_capacity = (rows + kCapacityStep - 1) / kCapacityStep * kCapacityStep;
  const size_t head_bytes = row_bytes() * new_capacity;
  for (auto* buffer : {&keys_, &values_}) {
    std::vector<uint8_t> grown(head_bytes * kv_heads_);
    // An empty buffer's data() may be null, and memcpy from null is undefined even for 0 bytes.
    for (int h = 0; h < kv_heads_ && rows_ > 0; ++h) {
      std::memcpy(grown.data() + h * head_bytes, buffer->data() + h * row_bytes() * capacity_,
                  row_bytes() * rows_);
    }
    buffer->swap(grown);
  }
  capacity_ = new_capacity;
}

void DenseRows::append(const float* k, const float* v, int64_t n) {
  reserve(rows_ + n);
  const size_t head_bytes = row_bytes() * capacity_;
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < kv_heads_; ++h) {
      const int64_t src = (t * kv_heads_ + h) * head_dim_;
      const size_t dst = h * head_bytes + (rows_ + t) * row_bytes();
      store_row(dtype_, k + src, head_dim_, keys_.data() + dst);
      store_row(dtype_, v + src, head_dim_, values_.data() + dst);
    }
  }
  rows_ += n;
}

void DenseRows::drop_newest(int64_t n) {
  rows_ -= n;
}

void DenseRows::drop_oldest(int64_t n) {
  if (n <= 0) return;  // nothing moves (and an empty buffer has no data to move)
  const size_t head_bytes = row_bytes() * capacity_;
  for (auto* buffer : {&keys_, &values_}) {
    for (int h = 0; h < kv_heads_; ++h) {
      uint8_t* head = buffer->data() + h * head_bytes;
      std::memmove(head, head + n * row_bytes(), (rows_ - n) * row_bytes());
    }
  }
  rows_ -= n;
}

void DenseRows::write(ByteWriter& out, int64_t first, int64_t n) const {
  for (const auto* buffer : {&keys_, &values_}) {
    for (int h = 0; h < kv_heads_; ++h) {
      out.bytes(buffer->data() + (h * capacity_ + first) * row_bytes(), n * row_bytes());
    }
  }
}

void DenseRows::read_append(ByteReader& in, int64_t n) {
  if (n < 0 || static_cast<uint64_t>(n) * row_bytes() * kv_heads_ * 2 > in.remaining()) {
    throw FormatError(str_cat("cache file is truncated: ", n, " tokens do not fit in the ",
                              in.remaining(), " bytes left"));
  }
  reserve(rows_ + n);
  for (auto* buffer : {&keys_, &values_}) {
    for (int h = 0; h < kv_heads_; ++h) {
      in.bytes(buffer->data() + (h * capacity_ + rows_) * row_bytes(), n * row_bytes(),
               "dense rows");
    }
  }
  rows_ += n;
}

void DenseRows::read_f32(int64_t first, int64_t n, float* k, float* v) const {
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < kv_heads_; ++h) {
      const int64_t dst = (t * kv_heads_ + h) * head_dim_;
      const uint8_t* key_row = key_head(h) + (first + t) * row_bytes();
      const uint8_t* value_row = value_head(h) + (first + t) * row_bytes();
      for (int i = 0; i < head_dim_; ++i) {
        k[dst + i] = load_element(dtype_, key_row, i);
        v[dst + i] = load_element(dtype_, value_row, i);
      }
    }
  }
}

const uint8_t* DenseRows::key_head(int h) const {
  return keys_.data() + h * row_bytes() * capacity_;
}

const uint8_t* DenseRows::value_head(int h) const {
  return values_.data() + h * row_bytes() * capacity_;
}

DenseKVView DenseRows::view(int64_t first_pos) const {
  DenseKVView view;
  view.dtype = dtype_;
  view.k = keys_.data();
  view.v = values_.data();
  view.kv_heads = kv_heads_;
  view.head_dim = head_dim_;
  view.head_stride = capacity_;
  view.n_tokens = rows_;
  view.first_pos = first_pos;
  return view;
}

}  // namespace turbokv
