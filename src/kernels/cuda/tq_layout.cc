// Conversion between the CPU codec's LSB-first codes and the device tile format (tq_layout.h).
#include "kernels/cuda/tq_layout.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "quant/bitpack.h"

namespace turbokv::cuda {
namespace {

using L = TQTileLayout;

uint32_t load_word(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}
void store_word(uint8_t* p, uint32_t w) {
  std::memcpy(p, &w, 4);
}

// Bits [bit, bit + width) of a lane's record inside a tile section.
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

TQTileLayout checked_layout(int key_bits, int value_bits, const char* what) {
  if (!TQTileLayout::supported(key_bits, value_bits)) {
    throw InvalidArgument(str_cat(what, ": K", key_bits, "/V", value_bits,
                                  " has no tile format (key and value bits 2..4)"));
  }
  return TQTileLayout{key_bits, value_bits};
}

}  // namespace

std::vector<uint8_t> tq_tiles_from_codes(const TQHostCodes& codes) {
  const L lay = checked_layout(codes.key_bits, codes.value_bits, "tq_tiles_from_codes");
  const size_t n = size_t(codes.tokens);
  const int kc_bytes = lay.key_code_bytes(), vc_bytes = lay.value_code_bytes();
  if (codes.tokens < 0 || codes.key_codes.size() != n * kc_bytes ||
      codes.value_codes.size() != n * vc_bytes || codes.key_norms.size() != n ||
      codes.value_norms.size() != n) {
    throw InvalidArgument(str_cat("tq_tiles_from_codes: arrays do not hold ", codes.tokens,
                                  " tokens of d=128 K", lay.key_bits, "/V", lay.value_bits,
                                  " codes (key codes ", codes.key_codes.size(),
                                  " B, value codes ", codes.value_codes.size(), " B)"));
  }
  const int tiles = (codes.tokens + L::kTileTokens - 1) / L::kTileTokens;
  std::vector<uint8_t> out(size_t(tiles) * lay.tile_bytes(), 0);
  for (int t = 0; t < codes.tokens; ++t) {
    uint8_t* tile = out.data() + size_t(t / L::kTileTokens) * lay.tile_bytes();
    const int tok = t % L::kTileTokens;
    const uint8_t* kc = codes.key_codes.data() + size_t(t) * kc_bytes;
    const uint8_t* vc = codes.value_codes.data() + size_t(t) * vc_bytes;
    for (int d = 0; d < L::kHeadDim; ++d) {
      write_lane_bits(tile, 0, L::key_lane(tok, d), lay.key_bit(tok, d), lay.key_bits,
                      quant::packed_code_at(kc, lay.key_bits, d));
      write_lane_bits(tile, lay.value_offset(), L::value_lane(tok, d), lay.value_bit(tok, d),
                      lay.value_bits, quant::packed_code_at(vc, lay.value_bits, d));
    }
    std::memcpy(tile + lay.norm_offset(tok, 0), &codes.key_norms[t], 2);
    std::memcpy(tile + lay.norm_offset(tok, 1), &codes.value_norms[t], 2);
  }
  return out;
}

TQHostCodes tq_codes_from_tiles(const uint8_t* tiles, int tokens, int key_bits, int value_bits) {
  const L lay = checked_layout(key_bits, value_bits, "tq_codes_from_tiles");
  const int kc_bytes = lay.key_code_bytes(), vc_bytes = lay.value_code_bytes();
  TQHostCodes codes;
  codes.tokens = tokens;
  codes.key_bits = key_bits;
  codes.value_bits = value_bits;
  codes.key_codes.assign(size_t(tokens) * kc_bytes, 0);
  codes.value_codes.assign(size_t(tokens) * vc_bytes, 0);
  codes.key_norms.assign(tokens, 0);
  codes.value_norms.assign(tokens, 0);
  std::vector<uint8_t> k_idx(L::kHeadDim), v_idx(L::kHeadDim);
  for (int t = 0; t < tokens; ++t) {
    const uint8_t* tile = tiles + size_t(t / L::kTileTokens) * lay.tile_bytes();
    const int tok = t % L::kTileTokens;
    for (int d = 0; d < L::kHeadDim; ++d) {
      k_idx[d] =
          uint8_t(read_lane_bits(tile, 0, L::key_lane(tok, d), lay.key_bit(tok, d), key_bits));
      v_idx[d] = uint8_t(read_lane_bits(tile, lay.value_offset(), L::value_lane(tok, d),
                                        lay.value_bit(tok, d), value_bits));
    }
    quant::pack_codes(k_idx.data(), L::kHeadDim, key_bits,
                      codes.key_codes.data() + size_t(t) * kc_bytes);
    quant::pack_codes(v_idx.data(), L::kHeadDim, value_bits,
                      codes.value_codes.data() + size_t(t) * vc_bytes);
    std::memcpy(&codes.key_norms[t], tile + lay.norm_offset(tok, 0), 2);
    std::memcpy(&codes.value_norms[t], tile + lay.norm_offset(tok, 1), 2);
  }
  return codes;
}

std::vector<uint8_t> tq_head_tiles_from_blocks(const uint8_t* blocks, int n_blocks, int kv_heads,
                                               int head, int tile_bytes) {
  const size_t run = size_t(kTilesPerBlock) * tile_bytes;
  std::vector<uint8_t> tiles(size_t(n_blocks) * run);
  for (int i = 0; i < n_blocks; ++i) {
    const uint8_t* src = blocks + (size_t(i) * kv_heads + head) * run;
    std::copy(src, src + run, tiles.begin() + ptrdiff_t(size_t(i) * run));
  }
  return tiles;
}

void tq_blocks_from_head_tiles(const uint8_t* tiles, int n_tiles, int kv_heads, int head,
                               uint8_t* blocks, int tile_bytes) {
  for (int t = 0; t < n_tiles; ++t) {
    uint8_t* dst = blocks + ((size_t(t / kTilesPerBlock) * kv_heads + head) * kTilesPerBlock +
                             t % kTilesPerBlock) *
                                size_t(tile_bytes);
    std::copy(tiles + size_t(t) * tile_bytes, tiles + size_t(t + 1) * tile_bytes, dst);
  }
}

}  // namespace turbokv::cuda
