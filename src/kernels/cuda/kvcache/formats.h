// The paged formats (paged.h) built from the CPU codecs (quant/): the device copies of the
// TurboQuant sign words, rotation matrices and codebooks that a TQFormat points at, and the
// uniform format (buffer-free, or with its rotations' device copies). No cache or engine
// logic: what a cache fixes per sequence (split channel orders, centering means, sink rows)
// travels in TQSequenceState, built by the caller.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/kvcache/paged.h"
#include "quant/codec.h"
#include "quant/codec_uniform.h"
#include "quant/rotation.h"

namespace turbokv::cuda {

// A TQFormat and the device memory its pointers refer to; format() is valid while this object
// lives (moving it keeps the pointers valid).
class TQDeviceFormat {
 public:
  // key / value: the layer's codecs, a quant::MseCodec (integer bits) or a quant::SplitCodec
  // (k + 0.5 bits; its halves' rotations and codebooks, not its channel order, which is per
  // sequence: TQSequenceState). Throws InvalidArgument for other codec types, key and value
  // dims that differ or kv_heads < 1.
  TQDeviceFormat(int kv_heads, const quant::TurboQuantCodec& key,
                 const quant::TurboQuantCodec& value);

  const TQFormat& format() const { return format_; }

 private:
  DeviceBuffer<uint8_t> storage_;  // every table, 16-B aligned pieces
  TQFormat format_;
};

// Throws InvalidArgument when the codecs' dims differ or kv_heads < 1.
UniformFormat make_uniform_format(int kv_heads, const quant::UniformCodec& key,
                                  const quant::UniformCodec& value);

// A UniformFormat whose keys and values are rotated before grouping (UniformFormat::rotated:
// the uniform cache's hadamard option) and the device memory of the rotations; format() is
// valid while this object lives (moving it keeps the pointers valid).
class RotatedUniformFormat {
 public:
  // Throws InvalidArgument when the rotations' dims are not the codecs'.
  RotatedUniformFormat(int kv_heads, const quant::UniformCodec& key,
                       const quant::UniformCodec& value, const quant::Rotation& key_rotation,
                       const quant::Rotation& value_rotation);
  const UniformFormat& format() const { return format_; }

 private:
  DeviceBuffer<uint8_t> storage_;
  UniformFormat format_;
};

}  // namespace turbokv::cuda
