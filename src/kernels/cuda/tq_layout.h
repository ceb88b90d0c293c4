// The device-side TurboQuant 3.5 cache format (keys 3-bit, values 4-bit, fp16 norms, d = 128),
// chosen so that the fused attention kernel reads every byte once with 16-byte coalesced loads
// and finds each thread's tensor-core operands in the words it loaded. It differs from the CPU
// codec's LSB-first layout (quant/bitpack.h); tq_tiles_from_codes / tq_codes_from_tiles
// convert, and tests check both directions.
//
// A sequence's cache for one KV head is an array of tiles of 32 tokens, 3712 B each
// (= 116 B per token):
//   [kv: 0, 1536)     key codes    3 chunks x 32 lanes x 16 B
//   [1536, 3584)      value codes  4 chunks x 32 lanes x 16 B
//   [3584, 3712)      norms        8 groups x 4 slots x (key, value) fp16
// Chunk i of lane L sits at byte 512*i + 16*L of its section, so load i of a warp reads 512
// contiguous bytes. Lane L = 4*g + c holds (mma fragment notation, g = L/4, c = L%4):
//  - keys: 12 words = 4 slots x 96 bits. Slot s is token 16*(s/2) + g + 8*(s%2) of the tile,
//    dims 32c..32c+31, code of dim 32c+i at bits [3i, 3i+3) of the slot (LSB-first). A 6-bit
//    pair (dims 32c+2q, 32c+2q+1) is one f16x2 A-operand register of the score MMA.
//  - values: 16 words, word 8*kb + mt (kb = token half, mt = 16-dim tile), byte j of the word =
//    A-operand register a_j of the P·V MMA: dim 16*mt + g + 8*(j%2), tokens
//    16*kb + 2c + 8*(j/2) (low nibble) and the next token (high nibble).
//  - norms: group g holds tokens g + {0, 8, 16, 24} (slot order), each as (key, value) fp16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace turbokv::cuda {

struct TQ35Layout {
  static constexpr int kHeadDim = 128;
  static constexpr int kKeyBits = 3;
  static constexpr int kValueBits = 4;
  static constexpr int kTileTokens = 32;
  static constexpr int kKeyBytes = kTileTokens * kHeadDim * kKeyBits / 8;      // 1536
  static constexpr int kValueBytes = kTileTokens * kHeadDim * kValueBits / 8;  // 2048
  static constexpr int kNormBytes = kTileTokens * 2 * 2;                       // 128
  static constexpr int kValueOffset = kKeyBytes;
  static constexpr int kNormOffset = kKeyBytes + kValueBytes;
  static constexpr int kTileBytes = kNormOffset + kNormBytes;
  static constexpr int kKeyWordsPerLane = kKeyBytes / 32 / 4;      // 12
  static constexpr int kValueWordsPerLane = kValueBytes / 32 / 4;  // 16
  static_assert(kTileBytes == 116 * kTileTokens, "3.5 bits: 116 B per token per KV head");
  static_assert(kKeyBytes % 512 == 0 && kValueBytes % 512 == 0, "whole 16-B chunks per lane");

  // Byte offset in the tile of lane word w of a section that starts at section_offset.
  static constexpr int lane_word_offset(int section_offset, int lane, int word) {
    return section_offset + 512 * (word / 4) + 16 * lane + 4 * (word % 4);
  }
  static constexpr int slot_of_token(int token) { return (token / 16) * 2 + (token % 16) / 8; }
  // Key code of (token, dim): lane, and bit position inside the lane's 384-bit record.
  static constexpr int key_lane(int token, int dim) { return 4 * (token % 8) + dim / 32; }
  static constexpr int key_bit(int token, int dim) {
    return 96 * slot_of_token(token) + kKeyBits * (dim % 32);
  }
  // Value code of (token, dim): lane, word, and bit position in the word.
  static constexpr int value_lane(int token, int dim) { return 4 * (dim % 8) + (token % 8) / 2; }
  static constexpr int value_word(int token, int dim) { return 8 * (token / 16) + dim / 16; }
  static constexpr int value_bit(int token, int dim) {
    return 8 * (2 * ((token % 16) / 8) + (dim % 16) / 8) + 4 * (token % 2);
  }
  // Byte offset of a token's norm; role 0 = key, 1 = value.
  static constexpr int norm_offset(int token, int role) {
    return kNormOffset + 16 * (token % 8) + 4 * slot_of_token(token) + 2 * role;
  }
};

// One KV head of one sequence in the CPU codec's format (quant::MseCodec, LSB-first codes):
//   key_codes [tokens, 48]  key_norms [tokens]  value_codes [tokens, 64]  value_norms [tokens]
struct TQHostCodes {
  int tokens = 0;
  std::vector<uint8_t> key_codes;
  std::vector<uint16_t> key_norms;
  std::vector<uint8_t> value_codes;
  std::vector<uint16_t> value_norms;
};

// CPU format -> device tiles [ceil(tokens / 32), kTileBytes]; bytes of tokens past the end
// of the last tile are zero. Throws InvalidArgument if the arrays do not match `tokens`.
std::vector<uint8_t> tq_tiles_from_codes(const TQHostCodes& codes);
// Device tiles -> CPU format for the first `tokens` tokens.
TQHostCodes tq_codes_from_tiles(const uint8_t* tiles, int tokens);

// Paged blocks of 256 tokens (kvcache/paged.h): a sequence's blocks
// [n_blocks][kv_heads][8 tiles][kTileBytes] hold head h's tiles [n_blocks * 8][kTileBytes].
constexpr int kTilesPerBlock = 8;
std::vector<uint8_t> tq_head_tiles_from_blocks(const uint8_t* blocks, int n_blocks, int kv_heads,
                                               int head);
// Writes head `head`'s tiles [n_tiles][kTileBytes] (n_tiles <= 8 * n_blocks) into the blocks.
void tq_blocks_from_head_tiles(const uint8_t* tiles, int n_tiles, int kv_heads, int head,
                               uint8_t* blocks);

}  // namespace turbokv::cuda
