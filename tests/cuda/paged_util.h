// Helpers of the paged KV tests: one format under test with its CPU codecs (how a token's
// record is written into a block and what vector it stands for), and a pool of blocks handed
// out to sequences in shuffled order, with host images of every block.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/kvcache/formats.h"
#include "kernels/cuda/kvcache/paged.h"
#include "quant/codec.h"
#include "quant/codec_split.h"
#include "quant/codec_uniform.h"

namespace turbokv::cuda::testing {

enum class FormatKind { kDense, kTurboQuant, kUniform };

struct FormatSpec {
  FormatKind kind = FormatKind::kTurboQuant;
  int kv_heads = 2;
  int head_dim = 128;
  DenseElem elem = DenseElem::kF32;     // dense
  double key_bits = 3, value_bits = 4;  // TurboQuant (k + 0.5: split) or uniform (integers)
  int group_size = 64;                  // uniform
  bool norm_correction = true;          // TurboQuant
  bool unbiased_norm = false;           // TurboQuant: stored n / <y, c>
  bool center = false;                  // TurboQuant: random fp16 means per KV head
  uint64_t seed = 0;
};

inline std::string describe(const FormatSpec& s) {
  std::ostringstream o;
  switch (s.kind) {
    case FormatKind::kDense:
      o << "dense "
        << (s.elem == DenseElem::kF32   ? "f32"
            : s.elem == DenseElem::kF16 ? "f16"
                                        : "bf16");
      break;
    case FormatKind::kTurboQuant:
      o << "turboquant K" << s.key_bits << "/V" << s.value_bits
        << (s.norm_correction ? "" : " no-norm-correction") << (s.unbiased_norm ? " unbiased" : "")
        << (s.center ? " centered" : "");
      break;
    case FormatKind::kUniform:
      o << "uniform K" << s.key_bits << "/V" << s.value_bits << " group " << s.group_size;
      break;
  }
  o << ", head_dim " << s.head_dim << ", kv_heads " << s.kv_heads;
  return o.str();
}

// The CPU side of one format for `sequences` sequences: codecs (split codecs with random
// channel orders per sequence and KV head, random fp16 means per sequence where centered), the
// device format and TQSequenceState array built from them, and record encode / decode on host
// block images.
class PagedCodec {
 public:
  PagedCodec(const FormatSpec& spec, int sequences) : spec_(spec) {
    std::mt19937_64 rng(spec.seed * 7919 + 17);
    const int d = spec.head_dim;
    if (spec.kind == FormatKind::kDense) {
      dense_ = DenseFormat{spec.elem, spec.kv_heads, d};
      geometry_ = block_geometry(dense_);
    } else if (spec.kind == FormatKind::kUniform) {
      ukey_ = std::make_unique<quant::UniformCodec>(
          quant::UniformCodecConfig{d, int(spec.key_bits), spec.group_size});
      uvalue_ = std::make_unique<quant::UniformCodec>(
          quant::UniformCodecConfig{d, int(spec.value_bits), spec.group_size});
      uniform_ = make_uniform_format(spec.kv_heads, *ukey_, *uvalue_);
      geometry_ = block_geometry(uniform_);
    } else {
      std::vector<TQSequenceState> states(sequences);
      bool stateful = false;
      for (int role = 0; role < 2; ++role) {
        const double bits = role == 0 ? spec.key_bits : spec.value_bits;
        quant::TurboQuantConfig c;
        c.dim = d;
        c.bits = bits;
        c.seed = spec.seed;
        c.role = role == 0 ? quant::TensorRole::kKey : quant::TensorRole::kValue;
        c.norm_correction = spec.norm_correction;
        c.unbiased_norm = spec.unbiased_norm;
        const bool split = bits != double(int(bits));
        auto& codecs = codecs_[role];  // [sequences][kv_heads]
        codecs.assign(sequences, std::vector<const quant::TurboQuantCodec*>(spec.kv_heads));
        auto& means = means_[role];
        means.resize(sequences);
        const quant::TurboQuantCodec* shared = nullptr;  // integer bits: one codec
        if (!split) {
          owned_.push_back(quant::make_turboquant_codec(c));
          shared = owned_.back().get();
        }
        for (int b = 0; b < sequences; ++b) {
          std::vector<int> orders;  // [kv_heads, d]
          for (int h = 0; h < spec.kv_heads; ++h) {
            if (split) {
              c.channel_order.resize(d);
              std::iota(c.channel_order.begin(), c.channel_order.end(), 0);
              std::shuffle(c.channel_order.begin(), c.channel_order.end(), rng);
              orders.insert(orders.end(), c.channel_order.begin(), c.channel_order.end());
              owned_.push_back(quant::make_turboquant_codec(c));
            }
            codecs[b][h] = split ? owned_.back().get() : shared;
          }
          if (split) {
            device_.push_back(upload_bytes(orders));
            (role == 0 ? states[b].key_order : states[b].value_order) =
                reinterpret_cast<const int*>(device_.back().data());
            stateful = true;
          }
          if (spec.center) {
            std::normal_distribution<float> dist(0.0f, 0.7f);
            means[b].resize(size_t(spec.kv_heads) * d);
            for (auto& m : means[b]) m = f32_to_f16(dist(rng));
            device_.push_back(upload_bytes(means[b]));
            (role == 0 ? states[b].key_mean : states[b].value_mean) =
                reinterpret_cast<const __half*>(device_.back().data());
            stateful = true;
          }
        }
      }
      tq_ = std::make_unique<TQDeviceFormat>(spec.kv_heads, *codecs_[0][0][0], *codecs_[1][0][0]);
      geometry_ = block_geometry(tq_->format());
      if (stateful) states_ = DeviceBuffer<TQSequenceState>::upload(states);
    }
  }

  const FormatSpec& spec() const { return spec_; }
  const BlockGeometry& geometry() const { return geometry_; }
  int head_dim() const { return spec_.head_dim; }
  int kv_heads() const { return spec_.kv_heads; }

  // Bytes of one vector's record in the (codes or elements) section and the aux section.
  size_t main_bytes(int role) const {
    switch (spec_.kind) {
      case FormatKind::kDense:
        return size_t(spec_.head_dim) * (spec_.elem == DenseElem::kF32 ? 4 : 2);
      case FormatKind::kUniform:
        return (role == 0 ? ukey_ : uvalue_)->code_bytes();
      case FormatKind::kTurboQuant:
        return codecs_[role][0][0]->code_bytes();
    }
    return 0;
  }
  size_t aux_bytes(int role) const {
    switch (spec_.kind) {
      case FormatKind::kDense:
        return 0;
      case FormatKind::kUniform:
        return 2 * size_t((role == 0 ? ukey_ : uvalue_)->params_per_vector());
      case FormatKind::kTurboQuant:
        return 2 * size_t(codecs_[role][0][0]->norms_per_vector());
    }
    return 0;
  }
  size_t main_offset(int role, int head, int token) const {
    return (role == 0 ? geometry_.k_offset : geometry_.v_offset) +
           (size_t(head) * kBlockTokens + token) * main_bytes(role);
  }
  size_t aux_offset(int role, int head, int token) const {
    return (role == 0 ? geometry_.k_aux_offset : geometry_.v_aux_offset) +
           (size_t(head) * kBlockTokens + token) * aux_bytes(role);
  }

  // Writes the record of x [head_dim] (role 0: key, 1: value) of sequence `seq`, KV head `head`
  // at `token` of a host block image, as the CPU codecs (scalar path) write it.
  void encode(int role, int seq, int head, const float* x, int token, uint8_t* block) const {
    uint8_t* main = block + main_offset(role, head, token);
    uint8_t* aux = block + aux_offset(role, head, token);
    const int d = spec_.head_dim;
    switch (spec_.kind) {
      case FormatKind::kDense:
        for (int i = 0; i < d; ++i) {
          if (spec_.elem == DenseElem::kF32) {
            std::memcpy(main + 4 * i, &x[i], 4);
          } else {
            const uint16_t h = spec_.elem == DenseElem::kF16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
            std::memcpy(main + 2 * i, &h, 2);
          }
        }
        return;
      case FormatKind::kUniform: {
        std::vector<uint16_t> params((role == 0 ? ukey_ : uvalue_)->params_per_vector());
        (role == 0 ? ukey_ : uvalue_)->quantize(x, main, params.data(), quant::Isa::kScalar);
        std::memcpy(aux, params.data(), 2 * params.size());
        return;
      }
      case FormatKind::kTurboQuant: {
        const quant::TurboQuantCodec& codec = *codecs_[role][seq][head];
        const std::vector<uint16_t>& mean = means_[role][seq];
        std::vector<float> centered(x, x + d);
        if (!mean.empty()) {
          for (int i = 0; i < d; ++i) centered[i] = x[i] - f16_to_f32(mean[size_t(head) * d + i]);
        }
        std::vector<uint16_t> norms(codec.norms_per_vector());
        codec.quantize(centered.data(), main, norms.data(), quant::Isa::kScalar);
        std::memcpy(aux, norms.data(), 2 * norms.size());
        return;
      }
    }
  }

  // The vector the record at `token` stands for: dequantized (+ the mean where centered).
  void decode(int role, int seq, int head, const uint8_t* block, int token, float* x) const {
    const uint8_t* main = block + main_offset(role, head, token);
    const uint8_t* aux = block + aux_offset(role, head, token);
    const int d = spec_.head_dim;
    std::vector<uint16_t> words(aux_bytes(role) / 2);
    if (!words.empty()) std::memcpy(words.data(), aux, aux_bytes(role));
    switch (spec_.kind) {
      case FormatKind::kDense:
        for (int i = 0; i < d; ++i) {
          if (spec_.elem == DenseElem::kF32) {
            std::memcpy(&x[i], main + 4 * i, 4);
          } else {
            uint16_t h;
            std::memcpy(&h, main + 2 * i, 2);
            x[i] = spec_.elem == DenseElem::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
          }
        }
        return;
      case FormatKind::kUniform:
        (role == 0 ? ukey_ : uvalue_)->dequantize(main, words.data(), x);
        return;
      case FormatKind::kTurboQuant: {
        codecs_[role][seq][head]->dequantize(main, words.data(), x);
        const std::vector<uint16_t>& mean = means_[role][seq];
        if (!mean.empty()) {
          for (int i = 0; i < d; ++i) x[i] += f16_to_f32(mean[size_t(head) * d + i]);
        }
        return;
      }
    }
  }

  // Which record a byte of a block belongs to (failure messages).
  std::string locate(size_t byte) const {
    const BlockGeometry& g = geometry_;
    const char* names[4] = {"key main", "value main", "key aux", "value aux"};
    const size_t starts[4] = {g.k_offset, g.v_offset, g.k_aux_offset, g.v_aux_offset};
    const size_t sizes[4] = {main_bytes(0), main_bytes(1), aux_bytes(0), aux_bytes(1)};
    for (int s = 3; s >= 0; --s) {
      if (sizes[s] == 0 || byte < starts[s]) continue;
      const size_t rel = byte - starts[s], row = rel / sizes[s];
      if (row >= size_t(spec_.kv_heads) * kBlockTokens) return "padding after a section";
      std::ostringstream o;
      o << names[s] << " section, head " << row / kBlockTokens << ", token " << row % kBlockTokens
        << ", byte " << rel % sizes[s] << " of " << sizes[s];
      return o.str();
    }
    return "before the first section";
  }

  void append(const PagedBatch& b, const AppendRows& rows, cudaStream_t stream) const {
    switch (spec_.kind) {
      case FormatKind::kDense:
        return paged_append(dense_, b, rows, stream);
      case FormatKind::kUniform:
        return paged_append(uniform_, b, rows, stream);
      case FormatKind::kTurboQuant:
        return paged_append(tq_->format(), b, states(), rows, stream);
    }
  }
  void attention(const PagedBatch& b, const QueryRows& q, const AttentionOptions& o,
                 void* workspace, size_t bytes, cudaStream_t stream) const {
    switch (spec_.kind) {
      case FormatKind::kDense:
        return paged_attention(dense_, b, q, o, workspace, bytes, stream);
      case FormatKind::kUniform:
        return paged_attention(uniform_, b, q, o, workspace, bytes, stream);
      case FormatKind::kTurboQuant:
        return paged_attention(tq_->format(), b, states(), q, o, workspace, bytes, stream);
    }
  }

 private:
  FormatSpec spec_;
  BlockGeometry geometry_;
  DenseFormat dense_;
  UniformFormat uniform_;
  std::unique_ptr<quant::UniformCodec> ukey_, uvalue_;
  template <typename T>
  static DeviceBuffer<uint8_t> upload_bytes(const std::vector<T>& v) {
    std::vector<uint8_t> bytes(v.size() * sizeof(T));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    return DeviceBuffer<uint8_t>::upload(bytes);
  }
  // The sequences' state array (nullptr when no tensor is split or centered).
  const TQSequenceState* states() const { return states_.size() > 0 ? states_.data() : nullptr; }

  std::vector<std::unique_ptr<quant::TurboQuantCodec>> owned_;
  std::vector<std::vector<const quant::TurboQuantCodec*>> codecs_[2];  // [role][seq][kv_heads]
  std::vector<std::vector<uint16_t>> means_[2];  // [role][seq]: [kv_heads, d] fp16 or empty
  std::vector<DeviceBuffer<uint8_t>> device_;    // orders and means
  DeviceBuffer<TQSequenceState> states_;
  std::unique_ptr<TQDeviceFormat> tq_;
};

// Blocks of one pool handed out to sequences in shuffled order: physical block 0 is the
// zero-filled block every table entry past a sequence's blocks points at; the others start as
// `fill` bytes. The pool has guard bands of `fill` before and after.
class BlockPool {
 public:
  static constexpr size_t kGuard = 4096;

  BlockPool(size_t block_bytes, const std::vector<int>& blocks_per_seq, int table_stride,
            uint64_t seed, uint8_t fill)
      : block_bytes_(block_bytes), stride_(table_stride), fill_(fill) {
    int total = 1;
    for (int n : blocks_per_seq) total += n;
    blocks_ = total;
    std::vector<int> physical(total - 1);
    std::iota(physical.begin(), physical.end(), 1);
    std::mt19937_64 rng(seed);
    std::shuffle(physical.begin(), physical.end(), rng);
    table_.assign(blocks_per_seq.size() * size_t(table_stride), 0);
    size_t next = 0;
    for (size_t b = 0; b < blocks_per_seq.size(); ++b) {
      for (int i = 0; i < blocks_per_seq[b]; ++i) table_[b * table_stride + i] = physical[next++];
    }
    image_.assign(kGuard + size_t(total) * block_bytes + kGuard, fill);
    std::fill(image_.begin() + kGuard, image_.begin() + kGuard + block_bytes, uint8_t(0));
    device_ = DeviceBuffer<uint8_t>(image_.size());
  }

  int batch() const { return int(table_.size() / stride_); }
  int table_stride() const { return stride_; }
  size_t block_bytes() const { return block_bytes_; }
  int physical(int seq, int logical) const { return table_[size_t(seq) * stride_ + logical]; }
  // Offset of block (seq, logical) in image() / download().
  size_t block_offset(int seq, int logical) const {
    return kGuard + size_t(physical(seq, logical)) * block_bytes_;
  }
  uint8_t* host_block(int seq, int logical) { return image_.data() + block_offset(seq, logical); }
  const std::vector<uint8_t>& image() const { return image_; }

  void upload() {
    TURBOKV_CUDA_CHECK(
        cudaMemcpy(device_.data(), image_.data(), image_.size(), cudaMemcpyHostToDevice));
    std::vector<uint8_t*> pointers(table_.size());
    for (size_t i = 0; i < table_.size(); ++i) {
      pointers[i] = device_.data() + kGuard + size_t(table_[i]) * block_bytes_;
    }
    device_table_ = DeviceBuffer<uint8_t*>::upload(pointers);
  }
  std::vector<uint8_t> download() const { return device_.download(); }

  PagedBatch paged_batch(const int* device_seq_len, int max_len) const {
    PagedBatch b;
    b.block_table = device_table_.data();
    b.table_stride = stride_;
    b.seq_len = device_seq_len;
    b.batch = batch();
    b.max_len = max_len;
    return b;
  }

  // Where pool byte i is: a guard band, the zero block, or block (sequence, logical) + offset.
  std::string locate(size_t i) const {
    if (i < kGuard) return "the guard band before the pool";
    if (i >= kGuard + size_t(blocks_) * block_bytes_) return "the guard band after the pool";
    const size_t rel = i - kGuard;
    const int block = int(rel / block_bytes_);
    std::ostringstream o;
    if (block == 0) {
      o << "the zero block";
    } else {
      for (size_t k = 0; k < table_.size(); ++k) {
        if (table_[k] == block) o << "sequence " << k / stride_ << " block " << k % stride_;
      }
    }
    o << " (physical " << block << "), byte " << rel % block_bytes_;
    return o.str();
  }
  size_t block_of(size_t i) const { return (i - kGuard) % block_bytes_; }
  bool in_blocks(size_t i) const {
    return i >= kGuard && i < kGuard + size_t(blocks_) * block_bytes_;
  }

 private:
  size_t block_bytes_;
  int stride_;
  uint8_t fill_;
  int blocks_ = 0;
  std::vector<int> table_;      // [batch, stride] physical block of each entry
  std::vector<uint8_t> image_;  // [guard | blocks | guard]
  DeviceBuffer<uint8_t> device_;
  DeviceBuffer<uint8_t*> device_table_;
};

}  // namespace turbokv::cuda::testing
