// Attention on TurboQuant codes, AVX2 path. Codes of up to 4 bits are decoded 8 at a time in
// registers: the codec's LSB-first layout (quant/bitpack.h) puts 8 codes in b bytes, so one
// 32-bit load, a broadcast, vpsrlvd and vpand give 8 indices; vpermps looks them up in the
// codebook (two lookups and a blend on bit 3 for 16 centroids). Wider codes go through the
// codec's decode_rotated.
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/attention_codes_core.h"
#include "kernels/cpu/attention_isa_avx2.h"

namespace turbokv::attention_detail {
namespace {

template <int B>
void decode_codes(const CodeSegment& seg, const uint8_t* codes, float norm, float* out) {
  const __m256 scale = _mm256_set1_ps(norm);
  const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
  const __m256i mask = _mm256_set1_epi32((1 << B) - 1);
  const __m256 low_table = _mm256_load_ps(seg.centroids);
  const __m256 high_table = _mm256_load_ps(seg.centroids + 8);
  for (int g = 0; g < seg.dim / 8; ++g) {
    uint32_t word;
    std::memcpy(&word, codes + g * B, sizeof(word));  // storage keeps 4 bytes of padding
    const __m256i idx = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts), mask);
    __m256 c = _mm256_permutevar8x32_ps(low_table, idx);
    if constexpr (B == 4) {
      const __m256 high = _mm256_permutevar8x32_ps(high_table, idx);
      c = _mm256_blendv_ps(c, high, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
    }
    _mm256_storeu_ps(out + 8 * g, _mm256_mul_ps(c, scale));
  }
}

struct RegisterDecoder {
  static void decode(const CodeSegment& seg, const uint8_t* codes, uint16_t norm_f16, float* out) {
    if (seg.dim % 8 != 0 || seg.bits > 4) {
      seg.codec->decode_rotated(codes, norm_f16, out);
      return;
    }
    const float norm = _cvtsh_ss(norm_f16);
    switch (seg.bits) {
      case 1:
        return decode_codes<1>(seg, codes, norm, out);
      case 2:
        return decode_codes<2>(seg, codes, norm, out);
      case 3:
        return decode_codes<3>(seg, codes, norm, out);
      default:
        return decode_codes<4>(seg, codes, norm, out);
    }
  }
};

// Uniform: 8 codes -> floats, then scale * q + min (multiply, then add: the rounding of
// UniformCodec::dequantize). Needs bits <= 4 and groups of a multiple of 8 elements.
template <int B>
void decode_uniform(const quant::UniformCodec& codec, const uint8_t* codes, const uint16_t* params,
                    float* out) {
  const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
  const __m256i mask = _mm256_set1_epi32((1 << B) - 1);
  const int per_group = codec.group_size() / 8;
  for (int g = 0; g < codec.dim() / 8; ++g) {
    const uint16_t* group = params + 2 * (g / per_group);
    uint32_t word;
    std::memcpy(&word, codes + g * B, sizeof(word));  // storage keeps 4 bytes of padding
    const __m256i idx = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts), mask);
    const __m256 x =
        _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(group[0])), _mm256_cvtepi32_ps(idx)),
                      _mm256_set1_ps(_cvtsh_ss(group[1])));
    _mm256_storeu_ps(out + 8 * g, x);
  }
}

struct UniformRegisterDecoder {
  static void decode(const quant::UniformCodec& codec, const uint8_t* codes, const uint16_t* params,
                     float* out) {
    if (codec.dim() % 8 != 0 || codec.bits() > 4 || codec.dim() % codec.group_size() != 0) {
      codec.dequantize(codes, params, out);
      return;
    }
    switch (codec.bits()) {
      case 2:
        return decode_uniform<2>(codec, codes, params, out);
      case 3:
        return decode_uniform<3>(codec, codes, params, out);
      default:
        return decode_uniform<4>(codec, codes, params, out);
    }
  }
};

}  // namespace

void attention_uniform_avx2(const UniformKVView& kv, const AttentionQueries& queries,
                            const AttentionParams& params, float* out) {
  attention_uniform_on<Avx2Isa, UniformRegisterDecoder>(kv, queries, params, out);
}

void attention_turboquant_avx2(const TurboQuantKVView& kv, const AttentionQueries& queries,
                               const AttentionParams& params, float* out) {
  attention_turboquant_on<Avx2Isa, RegisterDecoder>(kv, queries, params, out, quant::Isa::kAvx2);
}

}  // namespace turbokv::attention_detail
