// The device-side TurboQuant tile formats of the fused kernels (head_dim 128, integer-bit MSE
// codecs: keys kb and values vb bits, kb and vb in 2..4, fp16 norms), chosen so that the fused
// attention kernel reads every byte once with 16-byte coalesced loads and finds each thread's
// tensor-core operands in the words it loaded. They differ from the CPU codec's LSB-first
// layout (quant/bitpack.h); tq_tiles_from_codes / tq_codes_from_tiles convert, and tests check
// both directions.
//
// A sequence's cache for one KV head is an array of tiles of 32 tokens,
// 512 (kb + vb) + 128 B each (16 (kb + vb) + 4 B per token; K3/V4 and K4/V3: 3712 B):
//   [0, 512 kb)                 key codes    kb chunks x 32 lanes x 16 B
//   [512 kb, 512 (kb + vb))     value codes  vb chunks x 32 lanes x 16 B
//   [512 (kb + vb), + 128)      norms        8 groups x 4 slots x (key, value) fp16
// Chunk i of lane L sits at byte 512*i + 16*L of its section, so load i of a warp reads 512
// contiguous bytes. A lane's chunks of a section form its record of 128 kb (keys) or 128 vb
// (values) bits, word w at chunk w / 4, word w % 4. Lane L = 4*g + c holds (mma fragment
// notation, g = L/4, c = L%4):
//  - keys: 4 slots x 32 kb bits. Slot s is token 16*(s/2) + g + 8*(s%2) of the tile, dims
//    32c..32c+31, code of dim 32c+i at bits [kb i, kb (i+1)) of the slot (LSB-first). A pair
//    (dims 32c+2q, 32c+2q+1, 2 kb bits) is one f16x2 A-operand register of the score MMA.
//  - values: 16 operand groups of 8 vb bits, group 8*kt + mt (kt = token half, mt = 16-dim
//    tile); pair j (2 vb bits at 2 vb j of the group) = A-operand register a_j of the P·V MMA:
//    dim 16*mt + g + 8*(j%2), tokens 16*kt + 2c + 8*(j/2) (low code) and the next token (high
//    code). With vb = 4 a group is one word and a pair one byte.
//  - norms: group g holds tokens g + {0, 8, 16, 24} (slot order), each as (key, value) fp16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace turbokv::cuda {

struct TQTileLayout {
  static constexpr int kHeadDim = 128;
  static constexpr int kTileTokens = 32;
  static constexpr int kNormBytes = kTileTokens * 2 * 2;  // 128
  static constexpr int kMinBits = 2, kMaxBits = 4;
  int key_bits = 3;
  int value_bits = 4;

  static constexpr bool supported(int key_bits, int value_bits) {
    return key_bits >= kMinBits && key_bits <= kMaxBits && value_bits >= kMinBits &&
           value_bits <= kMaxBits;
  }
  constexpr int key_bytes() const { return kTileTokens * kHeadDim * key_bits / 8; }
  constexpr int value_bytes() const { return kTileTokens * kHeadDim * value_bits / 8; }
  constexpr int value_offset() const { return key_bytes(); }
  constexpr int norms_offset() const { return key_bytes() + value_bytes(); }
  constexpr int tile_bytes() const { return norms_offset() + kNormBytes; }
  constexpr int key_words_per_lane() const { return 4 * key_bits; }
  constexpr int value_words_per_lane() const { return 4 * value_bits; }
  // Per-vector bytes of the CPU codec's packed codes.
  constexpr int key_code_bytes() const { return kHeadDim * key_bits / 8; }
  constexpr int value_code_bytes() const { return kHeadDim * value_bits / 8; }

  // Byte offset in the tile of lane word w of a section that starts at section_offset.
  static constexpr int lane_word_offset(int section_offset, int lane, int word) {
    return section_offset + 512 * (word / 4) + 16 * lane + 4 * (word % 4);
  }
  static constexpr int slot_of_token(int token) { return (token / 16) * 2 + (token % 16) / 8; }
  // Key code of (token, dim): lane, and bit position inside the lane's record.
  static constexpr int key_lane(int token, int dim) { return 4 * (token % 8) + dim / 32; }
  constexpr int key_bit(int token, int dim) const {
    return 32 * key_bits * slot_of_token(token) + key_bits * (dim % 32);
  }
  // Value code of (token, dim): lane, and bit position inside the lane's record.
  static constexpr int value_lane(int token, int dim) { return 4 * (dim % 8) + (token % 8) / 2; }
  static constexpr int value_group(int token, int dim) { return 8 * (token / 16) + dim / 16; }
  static constexpr int value_pair(int token, int dim) {
    return 2 * ((token % 16) / 8) + (dim % 16) / 8;
  }
  constexpr int value_bit(int token, int dim) const {
    return 8 * value_bits * value_group(token, dim) + 2 * value_bits * value_pair(token, dim) +
           value_bits * (token % 2);
  }
  // Byte offset of a token's norm; role 0 = key, 1 = value.
  constexpr int norm_offset(int token, int role) const {
    return norms_offset() + 16 * (token % 8) + 4 * slot_of_token(token) + 2 * role;
  }
};

// The K3/V4 format (what --kv-bits 3.5 gives layer 0; "TurboQuant 3.5" of the kernel benches).
struct TQ35Layout {
  static constexpr TQTileLayout kLayout{3, 4};
  static constexpr int kHeadDim = TQTileLayout::kHeadDim;
  static constexpr int kKeyBits = 3;
  static constexpr int kValueBits = 4;
  static constexpr int kTileTokens = TQTileLayout::kTileTokens;
  static constexpr int kKeyBytes = kLayout.key_bytes();      // 1536
  static constexpr int kValueBytes = kLayout.value_bytes();  // 2048
  static constexpr int kNormBytes = TQTileLayout::kNormBytes;
  static constexpr int kValueOffset = kLayout.value_offset();
  static constexpr int kNormOffset = kLayout.norms_offset();
  static constexpr int kTileBytes = kLayout.tile_bytes();
  static_assert(kTileBytes == 116 * kTileTokens, "3.5 bits: 116 B per token per KV head");
  static constexpr int lane_word_offset(int section_offset, int lane, int word) {
    return TQTileLayout::lane_word_offset(section_offset, lane, word);
  }
};

// One KV head of one sequence in the CPU codec's format (quant::MseCodec, LSB-first codes):
//   key_codes [tokens, 16 key_bits]  key_norms [tokens]
//   value_codes [tokens, 16 value_bits]  value_norms [tokens]
struct TQHostCodes {
  int tokens = 0;
  int key_bits = 3;
  int value_bits = 4;
  std::vector<uint8_t> key_codes;
  std::vector<uint16_t> key_norms;
  std::vector<uint8_t> value_codes;
  std::vector<uint16_t> value_norms;
};

// CPU format -> device tiles [ceil(tokens / 32), tile_bytes] of the codes' bits; bytes of
// tokens past the end of the last tile are zero. Throws InvalidArgument if the arrays do not
// match `tokens` or the bits have no tile format.
std::vector<uint8_t> tq_tiles_from_codes(const TQHostCodes& codes);
// Device tiles -> CPU format for the first `tokens` tokens.
TQHostCodes tq_codes_from_tiles(const uint8_t* tiles, int tokens, int key_bits = 3,
                                int value_bits = 4);

// Paged blocks of 256 tokens (kvcache/paged.h): a sequence's blocks
// [n_blocks][kv_heads][8 tiles][tile_bytes] hold head h's tiles [n_blocks * 8][tile_bytes].
constexpr int kTilesPerBlock = 8;
std::vector<uint8_t> tq_head_tiles_from_blocks(const uint8_t* blocks, int n_blocks, int kv_heads,
                                               int head, int tile_bytes = TQ35Layout::kTileBytes);
// Writes head `head`'s tiles [n_tiles][tile_bytes] (n_tiles <= 8 * n_blocks) into the blocks.
void tq_blocks_from_head_tiles(const uint8_t* tiles, int n_tiles, int kv_heads, int head,
                               uint8_t* blocks, int tile_bytes = TQ35Layout::kTileBytes);

}  // namespace turbokv::cuda
