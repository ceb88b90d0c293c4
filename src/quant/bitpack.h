// Dense bit packing of b-bit codes (b = 1..8), the storage layout of every codec here.
//
// Layout ("LSB-first little-endian"): code i of a vector occupies bits [i*b, (i+1)*b) of the
// vector's byte string read as one little-endian integer; byte k holds bits [8k, 8k+8).
// So every group of 8 codes fills exactly b bytes, and for b <= 4 a group is one
// little-endian 32-bit load: code j of the group = (word >> (j*b)) & (2^b - 1), which AVX2
// does for 8 codes with one broadcast, one vpsrlvd and one vpand. The last partial group
// takes ceil(rem*b/8) bytes; unused high bits of the last byte are 0. Vectors are not
// padded: vector v of a batch starts at byte v * code_bytes().
#pragma once

#include <cstddef>
#include <cstdint>

namespace turbokv::quant {

struct PackedLayout {
  int dim = 0;
  int bits = 0;
  constexpr size_t code_bytes() const { return (size_t(dim) * size_t(bits) + 7) / 8; }
};

// The same layout with compile-time sizes, for kernels specialized on (dim, bits).
template <int Dim, int Bits>
struct PackedFormat {
  static_assert(Dim >= 1 && Bits >= 1 && Bits <= 8, "dim >= 1, bits 1..8");
  static constexpr int kDim = Dim;
  static constexpr int kBits = Bits;
  static constexpr size_t kCodeBytes = (size_t(Dim) * Bits + 7) / 8;
  // MSE codec record: codes + one fp16 norm.
  static constexpr size_t kMseBytesPerVector = kCodeBytes + 2;
  static constexpr PackedLayout layout() { return PackedLayout{Dim, Bits}; }
};
// At head_dim 128, K3/V4 costs 50 + 66 = 116 bytes per token per KV head.
static_assert(PackedFormat<128, 3>::kMseBytesPerVector + PackedFormat<128, 4>::kMseBytesPerVector ==
              116);

// Throws InvalidArgument for bits outside 1..8 or dim < 1.
PackedLayout make_packed_layout(int dim, int bits);

// codes [dim] (each < 2^bits) -> packed [code_bytes]. Scalar reference.
void pack_codes(const uint8_t* codes, int dim, int bits, uint8_t* packed);
// packed [code_bytes] -> codes [dim].
void unpack_codes(const uint8_t* packed, int dim, int bits, uint8_t* codes);

// Code i of a packed vector, the obvious way (reference for the kernels).
inline int packed_code_at(const uint8_t* packed, int bits, int i) {
  const size_t bit = size_t(i) * bits;
  const unsigned two_bytes =
      packed[bit / 8] | ((bit % 8 + bits > 8) ? unsigned(packed[bit / 8 + 1]) << 8 : 0u);
  return int((two_bytes >> (bit % 8)) & ((1u << bits) - 1));
}

}  // namespace turbokv::quant
