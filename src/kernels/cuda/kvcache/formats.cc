// Builds the device formats from the CPU codecs: one host arena of every table, uploaded once,
// with the format's pointers patched to the device copy.
#include "kernels/cuda/kvcache/formats.h"

#include <cstring>
#include <functional>

#include "core/error.h"
#include "quant/codec_mse.h"
#include "quant/codec_split.h"

namespace turbokv::cuda {
namespace {

// Host image of the device storage; pointers are recorded as offsets until the upload.
class Arena {
 public:
  template <typename T>
  size_t put(const T* data, size_t count) {
    const size_t offset = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(offset + count * sizeof(T));
    if (count > 0) std::memcpy(bytes_.data() + offset, data, count * sizeof(T));
    return offset;
  }
  template <typename T>
  size_t put(const std::vector<T>& data) {
    return put(data.data(), data.size());
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Pointer fields of the format and the arena offsets they will point at once uploaded.
class Patches {
 public:
  template <typename T>
  void point(const T*& field, size_t offset) {
    fixups_.push_back([&field, offset](const uint8_t* base) {
      field = reinterpret_cast<const T*>(base + offset);
    });
  }
  void apply(const uint8_t* base) const {
    for (const auto& fix : fixups_) fix(base);
  }

 private:
  std::vector<std::function<void(const uint8_t*)>> fixups_;
};

// A segment's rotation fields (dim, Hadamard signs and scale, or the dense matrices).
void build_rotation(const quant::Rotation& rotation, Arena& arena, Patches& patches, TQSegment& g) {
  g.dim = rotation.dim();
  g.hadamard = rotation.is_hadamard() ? 1 : 0;
  if (g.hadamard) {
    g.hadamard_scale = rotation.hadamard_scale();
    std::vector<uint32_t> words((g.dim + 31) / 32, 0u);
    for (int i = 0; i < g.dim; ++i) {
      if (rotation.sign_flips()[i]) words[i / 32] |= 1u << (i % 32);
    }
    patches.point(g.sign_words, arena.put(words));
  } else {
    patches.point(g.rotation, arena.put(rotation.matrix()));
    patches.point(g.rotation_t, arena.put(rotation.matrix_transposed()));
  }
}

// One MSE segment from a codec: dims, bits, rotation and codebook.
void build_segment(const quant::MseCodec& c, int channel_offset, int code_offset, int index,
                   Arena& arena, Patches& patches, TQSegment& g) {
  build_rotation(c.rotation(), arena, patches, g);
  g.dim = c.dim();
  g.bits = c.int_bits();
  g.code_offset = code_offset;
  g.norm_index = index;
  g.channel_offset = channel_offset;
  // 2: the unbiased norm n / <y, c[idx]> (quant/codec_mse.h step 5), 1: n / |c[idx]|, 0: n.
  g.norm_correction = c.unbiased_norm() ? 2 : c.norm_correction() ? 1 : 0;
  patches.point(g.centroids, arena.put(c.codebook().centroids));
  patches.point(g.boundaries, arena.put(c.codebook().boundaries));
}

void build_tensor(const quant::TurboQuantCodec& codec, const char* role, Arena& arena,
                  Patches& patches, TQTensorFormat& t) {
  t.code_bytes = int(codec.code_bytes());
  if (const auto* split = dynamic_cast<const quant::SplitCodec*>(&codec)) {
    t.segments = 2;
    build_segment(split->high(), 0, 0, 0, arena, patches, t.seg[0]);
    build_segment(split->low(), split->high_dim(), int(split->high().code_bytes()), 1, arena,
                  patches, t.seg[1]);
  } else if (const auto* mse = dynamic_cast<const quant::MseCodec*>(&codec)) {
    t.segments = 1;
    build_segment(*mse, 0, 0, 0, arena, patches, t.seg[0]);
  } else {
    throw InvalidArgument(
        str_cat("TurboQuant ", role, " codec: only MseCodec and SplitCodec have a device format"));
  }
  t.norms_per_vector = t.segments;
}

}  // namespace

TQDeviceFormat::TQDeviceFormat(int kv_heads, const quant::TurboQuantCodec& key,
                               const quant::TurboQuantCodec& value) {
  if (key.dim() != value.dim()) {
    throw InvalidArgument(
        str_cat("TQDeviceFormat: key dim ", key.dim(), " != value dim ", value.dim()));
  }
  format_.kv_heads = kv_heads;
  format_.head_dim = key.dim();
  Arena arena;
  Patches patches;
  build_tensor(key, "key", arena, patches, format_.key);
  build_tensor(value, "value", arena, patches, format_.value);
  storage_ = DeviceBuffer<uint8_t>::upload(arena.bytes());
  patches.apply(storage_.data());
  block_geometry(format_);  // the kernels' checks (kv_heads, dims, bits)
}

UniformFormat make_uniform_format(int kv_heads, const quant::UniformCodec& key,
                                  const quant::UniformCodec& value) {
  if (key.dim() != value.dim()) {
    throw InvalidArgument(
        str_cat("uniform format: key dim ", key.dim(), " != value dim ", value.dim()));
  }
  UniformFormat f;
  f.kv_heads = kv_heads;
  f.head_dim = key.dim();
  for (auto [t, c] : {std::pair{&f.key, &key}, std::pair{&f.value, &value}}) {
    t->bits = c->bits();
    t->group_size = c->group_size();
    t->code_bytes = int(c->code_bytes());
    t->groups = c->groups();
  }
  block_geometry(f);  // the kernels' checks (kv_heads, head_dim)
  return f;
}

RotatedUniformFormat::RotatedUniformFormat(int kv_heads, const quant::UniformCodec& key,
                                           const quant::UniformCodec& value,
                                           const quant::Rotation& key_rotation,
                                           const quant::Rotation& value_rotation)
    : format_(make_uniform_format(kv_heads, key, value)) {
  if (key_rotation.dim() != format_.head_dim || value_rotation.dim() != format_.head_dim) {
    throw InvalidArgument(str_cat("uniform format: rotations of dims ", key_rotation.dim(), " and ",
                                  value_rotation.dim(), " for head_dim ", format_.head_dim));
  }
  Arena arena;
  Patches patches;
  for (auto [t, r] : {std::pair{&format_.key_rotation, &key_rotation},
                      std::pair{&format_.value_rotation, &value_rotation}}) {
    t->segments = 1;
    t->norms_per_vector = 1;
    build_rotation(*r, arena, patches, t->seg[0]);
  }
  format_.rotated = 1;
  storage_ = DeviceBuffer<uint8_t>::upload(arena.bytes());
  patches.apply(storage_.data());
  block_geometry(format_);  // the kernels' checks (the rotations too)
}

}  // namespace turbokv::cuda
