// A small GGUF v3 writer for tests: metadata and tensors laid out as the format describes
// (little-endian; tensor data aligned to general.alignment), so tests can build valid files
// and then break them.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace turbokv::testing {

class GgufWriter {
 public:
  enum Kind : uint32_t {
    kU8 = 0,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9
  };

  void add_u32(const std::string& key, uint32_t v) { scalar(key, kU32, &v, 4); }
  void add_i32(const std::string& key, int32_t v) { scalar(key, kI32, &v, 4); }
  void add_f32(const std::string& key, float v) { scalar(key, kF32, &v, 4); }
  void add_bool(const std::string& key, bool v) {
    const uint8_t b = v ? 1 : 0;
    scalar(key, kBool, &b, 1);
  }
  void add_string(const std::string& key, const std::string& v) {
    header_key(key, kString);
    put_string(kv_, v);
  }
  void add_strings(const std::string& key, const std::vector<std::string>& v) {
    header_key(key, kArray);
    put<uint32_t>(kv_, kString);
    put<uint64_t>(kv_, v.size());
    for (const std::string& s : v) put_string(kv_, s);
  }
  void add_f32s(const std::string& key, const std::vector<float>& v) {
    header_key(key, kArray);
    put<uint32_t>(kv_, kF32);
    put<uint64_t>(kv_, v.size());
    for (float x : v) put(kv_, x);
  }
  void add_i32s(const std::string& key, const std::vector<int32_t>& v) {
    header_key(key, kArray);
    put<uint32_t>(kv_, kI32);
    put<uint64_t>(kv_, v.size());
    for (int32_t x : v) put(kv_, x);
  }
  // ne in GGUF order (values per row first); bytes as stored.
  void add_tensor(const std::string& name, uint32_t type, const std::vector<int64_t>& ne,
                  const std::vector<uint8_t>& bytes) {
    tensors_.push_back({name, type, ne, bytes});
  }

  std::vector<uint8_t> bytes(uint64_t alignment = 32) const {
    std::vector<uint8_t> out;
    out.insert(out.end(), {'G', 'G', 'U', 'F'});
    put<uint32_t>(out, 3);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors_) {
      put_string(out, t.name);
      put<uint32_t>(out, uint32_t(t.ne.size()));
      for (int64_t d : t.ne) put<uint64_t>(out, uint64_t(d));
      put<uint32_t>(out, t.type);
      put<uint64_t>(out, offset);
      offsets.push_back(offset);
      offset = (offset + t.bytes.size() + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(data_start + offsets[i], 0);
      out.insert(out.end(), tensors_[i].bytes.begin(), tensors_[i].bytes.end());
    }
    return out;
  }

  void write(const std::string& path, uint64_t alignment = 32) const {
    const std::vector<uint8_t> b = bytes(alignment);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
  };
  template <typename T>
  static void put(std::vector<uint8_t>& out, T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
  }
  static void put_string(std::vector<uint8_t>& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  void header_key(const std::string& key, uint32_t kind) {
    put_string(kv_, key);
    put<uint32_t>(kv_, kind);
    ++n_kv_;
  }
  void scalar(const std::string& key, uint32_t kind, const void* v, size_t n) {
    header_key(key, kind);
    const uint8_t* p = static_cast<const uint8_t*>(v);
    kv_.insert(kv_.end(), p, p + n);
  }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace turbokv::testing
