// Bit packing: the documented LSB-first layout on hand-computed bytes, round trips for every
// b and awkward d, no writes past code_bytes().
#include "quant/bitpack.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace turbokv::quant {
namespace {

TEST(Bitpack, LayoutIsLsbFirstLittleEndian) {
  // 3-bit codes 1..7, 0: Σ c_j << 3j = 1 + 2·8 + 3·64 + 4·512 + 5·4096 + 6·32768 + 7·262144
  // = 2054353 = 0x1F58D1 -> bytes D1 58 1F.
  const uint8_t codes[8] = {1, 2, 3, 4, 5, 6, 7, 0};
  uint8_t packed[3];
  pack_codes(codes, 8, 3, packed);
  EXPECT_EQ(packed[0], 0xD1);
  EXPECT_EQ(packed[1], 0x58);
  EXPECT_EQ(packed[2], 0x1F);
  // 4-bit: low nibble first.
  const uint8_t nibbles[3] = {0x1, 0xA, 0x7};
  uint8_t packed4[2];
  pack_codes(nibbles, 3, 4, packed4);
  EXPECT_EQ(packed4[0], 0xA1);
  EXPECT_EQ(packed4[1], 0x07);  // unused high bits are zero
  // 1-bit: code i is bit i.
  const uint8_t bits[9] = {1, 0, 0, 0, 0, 0, 0, 1, 1};
  uint8_t packed1[2];
  pack_codes(bits, 9, 1, packed1);
  EXPECT_EQ(packed1[0], 0x81);
  EXPECT_EQ(packed1[1], 0x01);
}

TEST(Bitpack, RoundTripsEveryBitWidthAndAwkwardDims) {
  Xoshiro256 rng(4);
  for (int bits = 1; bits <= 8; ++bits) {
    for (int dim : {1, 2, 3, 5, 7, 8, 9, 15, 17, 64, 80, 96, 127, 128, 131, 256}) {
      const PackedLayout layout = make_packed_layout(dim, bits);
      EXPECT_EQ(layout.code_bytes(), (size_t(dim) * bits + 7) / 8);
      std::vector<uint8_t> codes(dim), back(dim);
      for (auto& c : codes) c = uint8_t(rng.next() & ((1u << bits) - 1));
      std::vector<uint8_t> packed(layout.code_bytes() + 4, 0xEE);  // guard bytes
      pack_codes(codes.data(), dim, bits, packed.data());
      for (size_t g = layout.code_bytes(); g < packed.size(); ++g) {
        ASSERT_EQ(packed[g], 0xEE) << "write past the end, bits " << bits << " dim " << dim;
      }
      unpack_codes(packed.data(), dim, bits, back.data());
      ASSERT_EQ(codes, back) << "bits " << bits << " dim " << dim;
      for (int i = 0; i < dim; ++i) ASSERT_EQ(packed_code_at(packed.data(), bits, i), codes[i]);
    }
  }
}

TEST(Bitpack, CompileTimeFormatMatchesRuntimeLayout) {
  static_assert(PackedFormat<80, 3>::kCodeBytes == 30);
  static_assert(PackedFormat<3, 5>::kCodeBytes == 2);
  using Format128x4 = PackedFormat<128, 4>;
  using Format97x7 = PackedFormat<97, 7>;
  EXPECT_EQ(make_packed_layout(128, 4).code_bytes(), Format128x4::kCodeBytes);
  EXPECT_EQ(make_packed_layout(97, 7).code_bytes(), Format97x7::layout().code_bytes());
}

TEST(Bitpack, InvalidParametersThrow) {
  EXPECT_THROW(make_packed_layout(128, 0), InvalidArgument);
  EXPECT_THROW(make_packed_layout(128, 9), InvalidArgument);
  EXPECT_THROW(make_packed_layout(0, 3), InvalidArgument);
}

}  // namespace
}  // namespace turbokv::quant
