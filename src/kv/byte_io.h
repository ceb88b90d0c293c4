// Little-endian byte streams for cache files (kv/cache_file.h). ByteWriter appends to a buffer;
// ByteReader reads from a span and throws FormatError naming what it was reading when the
// data ends early. Values are written in host order (the format is defined little-endian; a
// static_assert in cache_file.cc refuses big-endian hosts).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace turbokv {

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&value, sizeof(T));
  }
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    buffer_.insert(buffer_.end(), p, p + n);
  }
  void string(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void reserve(size_t n) { buffer_.reserve(n); }
  const std::vector<uint8_t>& buffer() const { return buffer_; }
  // Moves the bytes out (the writer is empty after).
  std::vector<uint8_t> take() { return std::move(buffer_); }

 private:
  std::vector<uint8_t> buffer_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  T get(const char* what) {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    bytes(&value, sizeof(T), what);
    return value;
  }
  void bytes(void* out, size_t n, const char* what) {
    if (n > size_ - pos_) {
      throw FormatError(str_cat("cache file is truncated: reading ", what, " needs ", n,
                                " bytes at offset ", pos_, ", ", size_ - pos_, " left"));
    }
    if (n == 0) return;  // out may be an empty vector's null data(): no memcpy from or to null
    std::memcpy(out, data_ + pos_, n);
    pos_ += n;
  }
  std::string string(const char* what, size_t max_size = 256) {
    const uint32_t n = get<uint32_t>(what);
    if (n > max_size)
      throw FormatError(str_cat("cache file: ", what, " length ", n, " is too long"));
    std::string s(n, '\0');
    bytes(s.data(), n, what);
    return s;
  }
  size_t position() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Throws InvalidArgument "<what> is <found> in the file, <expected> here" (a cache file saved
// from another model or KV configuration).
template <typename T>
void expect_same(const char* what, const T& found, const T& expected) {
  if (found != expected) {
    throw InvalidArgument(str_cat(what, " is ", found, " in the file, ", expected, " here"));
  }
}

// Every cache record starts with its kind and shape.
inline void write_cache_header(ByteWriter& out, const std::string& kind, int kv_heads,
                               int head_dim) {
  out.string(kind);
  out.put<int32_t>(kv_heads);
  out.put<int32_t>(head_dim);
}
inline void read_cache_header(ByteReader& in, const std::string& kind, int kv_heads, int head_dim) {
  expect_same("cache type", in.string("cache type"), kind);
  expect_same("kv_heads", in.get<int32_t>("kv_heads"), kv_heads);
  expect_same("head_dim", in.get<int32_t>("head_dim"), head_dim);
}

// Upper bound on the tokens of one layer in a file (guards allocations on corrupt input).
constexpr int64_t kMaxFileTokens = int64_t(1) << 31;

}  // namespace turbokv
