// Scalar packing of b-bit codes in the LSB-first layout of bitpack.h.
#include "quant/bitpack.h"

#include <cstring>

#include "core/error.h"

namespace turbokv::quant {

PackedLayout make_packed_layout(int dim, int bits) {
  if (bits < 1 || bits > 8) {
    throw InvalidArgument(str_cat("code bits ", bits, " is invalid: allowed 1..8"));
  }
  if (dim < 1) throw InvalidArgument(str_cat("dimension ", dim, " is invalid: need d >= 1"));
  return PackedLayout{dim, bits};
}

void pack_codes(const uint8_t* codes, int dim, int bits, uint8_t* packed) {
  const size_t n_bytes = (size_t(dim) * bits + 7) / 8;
  std::memset(packed, 0, n_bytes);
  for (int i = 0; i < dim; ++i) {
    const size_t bit = size_t(i) * bits;
    const unsigned shifted = unsigned(codes[i]) << (bit % 8);
    packed[bit / 8] |= uint8_t(shifted);
    if (bit % 8 + bits > 8) packed[bit / 8 + 1] |= uint8_t(shifted >> 8);
  }
}

void unpack_codes(const uint8_t* packed, int dim, int bits, uint8_t* codes) {
  for (int i = 0; i < dim; ++i) codes[i] = uint8_t(packed_code_at(packed, bits, i));
}

}  // namespace turbokv::quant
