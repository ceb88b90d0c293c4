// Conversion between the CPU codec's LSB-first codes and the device tile format (tq_layout.h).
#include "kernels/cuda/tq_layout.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "quant/bitpack.h"

namespace turbokv::cuda {
namespace {

using L = TQ35Layout;
constexpr int kKeyCodeBytes = L::kHeadDim * L::kKeyBits / 8;      // 48
constexpr int kValueCodeBytes = L::kHeadDim * L::kValueBits / 8;  // 64

uint32_t load_word(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}
void store_word(uint8_t* p, uint32_t w) {
  std::memcpy(p, &w, 4);
}

// Bits [bit, bit + width) of a lane's record of `words` 32-bit words inside a tile section.
int read_lane_bits(const uint8_t* tile, int section, int lane, int bit, int width) {
  int value = 0;
  for (int i = 0; i < width; ++i) {
    const int b = bit + i;
    const uint32_t w = load_word(tile + L::lane_word_offset(section, lane, b / 32));
    value |= int((w >> (b % 32)) & 1u) << i;
  }
  return value;
}
void write_lane_bits(uint8_t* tile, int section, int lane, int bit, int width, int value) {
  for (int i = 0; i < width; ++i) {
    const int b = bit + i;
    uint8_t* p = tile + L::lane_word_offset(section, lane, b / 32);
    uint32_t w = load_word(p);
    w = (w & ~(1u << (b % 32))) | (uint32_t((value >> i) & 1) << (b % 32));
    store_word(p, w);
  }
}

}  // namespace

std::vector<uint8_t> tq_tiles_from_codes(const TQHostCodes& codes) {
  const size_t n = size_t(codes.tokens);
  if (codes.tokens < 0 || codes.key_codes.size() != n * kKeyCodeBytes ||
      codes.value_codes.size() != n * kValueCodeBytes || codes.key_norms.size() != n ||
      codes.value_norms.size() != n) {
    throw InvalidArgument(str_cat("tq_tiles_from_codes: arrays do not hold ", codes.tokens,
                                  " tokens of d=128 K3/V4 codes (key codes ",
                                  codes.key_codes.size(), " B, value codes ",
                                  codes.value_codes.size(), " B)"));
  }
  const int tiles = (codes.tokens + L::kTileTokens - 1) / L::kTileTokens;
  std::vector<uint8_t> out(size_t(tiles) * L::kTileBytes, 0);
  for (int t = 0; t < codes.tokens; ++t) {
    uint8_t* tile = out.data() + size_t(t / L::kTileTokens) * L::kTileBytes;
    const int tok = t % L::kTileTokens;
    const uint8_t* kc = codes.key_codes.data() + size_t(t) * kKeyCodeBytes;
    const uint8_t* vc = codes.value_codes.data() + size_t(t) * kValueCodeBytes;
    for (int d = 0; d < L::kHeadDim; ++d) {
      write_lane_bits(tile, 0, L::key_lane(tok, d), L::key_bit(tok, d), L::kKeyBits,
                      quant::packed_code_at(kc, L::kKeyBits, d));
      write_lane_bits(tile, L::kValueOffset, L::value_lane(tok, d),
                      32 * L::value_word(tok, d) + L::value_bit(tok, d), L::kValueBits,
                      quant::packed_code_at(vc, L::kValueBits, d));
    }
    std::memcpy(tile + L::norm_offset(tok, 0), &codes.key_norms[t], 2);
    std::memcpy(tile + L::norm_offset(tok, 1), &codes.value_norms[t], 2);
  }
  return out;
}

TQHostCodes tq_codes_from_tiles(const uint8_t* tiles, int tokens) {
  TQHostCodes codes;
  codes.tokens = tokens;
  codes.key_codes.assign(size_t(tokens) * kKeyCodeBytes, 0);
  codes.value_codes.assign(size_t(tokens) * kValueCodeBytes, 0);
  codes.key_norms.assign(tokens, 0);
  codes.value_norms.assign(tokens, 0);
  std::vector<uint8_t> k_idx(L::kHeadDim), v_idx(L::kHeadDim);
  for (int t = 0; t < tokens; ++t) {
    const uint8_t* tile = tiles + size_t(t / L::kTileTokens) * L::kTileBytes;
    const int tok = t % L::kTileTokens;
    for (int d = 0; d < L::kHeadDim; ++d) {
      k_idx[d] =
          uint8_t(read_lane_bits(tile, 0, L::key_lane(tok, d), L::key_bit(tok, d), L::kKeyBits));
      v_idx[d] =
          uint8_t(read_lane_bits(tile, L::kValueOffset, L::value_lane(tok, d),
                                 32 * L::value_word(tok, d) + L::value_bit(tok, d), L::kValueBits));
    }
    quant::pack_codes(k_idx.data(), L::kHeadDim, L::kKeyBits,
                      codes.key_codes.data() + size_t(t) * kKeyCodeBytes);
    quant::pack_codes(v_idx.data(), L::kHeadDim, L::kValueBits,
                      codes.value_codes.data() + size_t(t) * kValueCodeBytes);
    std::memcpy(&codes.key_norms[t], tile + L::norm_offset(tok, 0), 2);
    std::memcpy(&codes.value_norms[t], tile + L::norm_offset(tok, 1), 2);
  }
  return codes;
}

std::vector<uint8_t> tq_head_tiles_from_blocks(const uint8_t* blocks, int n_blocks, int kv_heads,
                                               int head) {
  const size_t run = size_t(kTilesPerBlock) * TQ35Layout::kTileBytes;
  std::vector<uint8_t> tiles(size_t(n_blocks) * run);
  for (int i = 0; i < n_blocks; ++i) {
    const uint8_t* src = blocks + (size_t(i) * kv_heads + head) * run;
    std::copy(src, src + run, tiles.begin() + ptrdiff_t(size_t(i) * run));
  }
  return tiles;
}

void tq_blocks_from_head_tiles(const uint8_t* tiles, int n_tiles, int kv_heads, int head,
                               uint8_t* blocks) {
  for (int t = 0; t < n_tiles; ++t) {
    uint8_t* dst = blocks + ((size_t(t / kTilesPerBlock) * kv_heads + head) * kTilesPerBlock +
                             t % kTilesPerBlock) *
                                TQ35Layout::kTileBytes;
    std::copy(tiles + size_t(t) * TQ35Layout::kTileBytes,
              tiles + size_t(t + 1) * TQ35Layout::kTileBytes, dst);
  }
}

}  // namespace turbokv::cuda
