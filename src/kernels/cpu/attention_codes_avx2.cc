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

template <int B, bool kApplyNorm>
void decode_tile_bits(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                      const uint16_t* norms, int norm_stride, int n, float* out, int d,
                      float* norms_out) {
  const __m256i shifts = _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B);
  const __m256i mask = _mm256_set1_epi32((1 << B) - 1);
  const __m256 low_table = _mm256_load_ps(seg.centroids);
  const __m256 high_table = _mm256_load_ps(seg.centroids + 8);
  const int groups = seg.dim / 8;
  for (int i = 0; i < n; ++i) {
    const uint8_t* vector_codes = codes + i * code_stride;
    float* row = out + static_cast<int64_t>(i) * d;
    const float norm = _cvtsh_ss(norms[i * norm_stride]);
    const __m256 scale = _mm256_set1_ps(norm);
    if constexpr (!kApplyNorm) norms_out[i] = norm;
    for (int g = 0; g < groups; ++g) {
      uint32_t word;
      std::memcpy(&word, vector_codes + g * B, sizeof(word));  // storage keeps 4 bytes of padding
      const __m256i idx = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts), mask);
      __m256 c = _mm256_permutevar8x32_ps(low_table, idx);
      if constexpr (B == 4) {
        const __m256 high = _mm256_permutevar8x32_ps(high_table, idx);
        c = _mm256_blendv_ps(c, high, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
      }
      _mm256_storeu_ps(row + 8 * g, kApplyNorm ? _mm256_mul_ps(c, scale) : c);
    }
  }
}

struct RegisterDecoder {
  static void decode_tile(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                          const uint16_t* norms, int norm_stride, int n, float* out, int d,
                          float* norms_out) {
    if (seg.dim % 8 != 0 || seg.bits > 4) {
      const uint16_t unit_norm = 0x3C00;  // 1.0 in fp16
      for (int i = 0; i < n; ++i) {
        const uint16_t norm = norms[i * norm_stride];
        if (norms_out != nullptr) norms_out[i] = _cvtsh_ss(norm);
        seg.codec->decode_rotated(codes + i * code_stride, norms_out != nullptr ? unit_norm : norm,
                                  out + i * d);
      }
      return;
    }
    if (norms_out != nullptr) {
      dispatch_bits<false>(seg, codes, code_stride, norms, norm_stride, n, out, d, norms_out);
    } else {
      dispatch_bits<true>(seg, codes, code_stride, norms, norm_stride, n, out, d, norms_out);
    }
  }

  template <bool kApplyNorm>
  static void dispatch_bits(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                            const uint16_t* norms, int norm_stride, int n, float* out, int d,
                            float* norms_out) {
    switch (seg.bits) {
      case 1:
        return decode_tile_bits<1, kApplyNorm>(seg, codes, code_stride, norms, norm_stride, n, out,
                                               d, norms_out);
      case 2:
        return decode_tile_bits<2, kApplyNorm>(seg, codes, code_stride, norms, norm_stride, n, out,
                                               d, norms_out);
      case 3:
        return decode_tile_bits<3, kApplyNorm>(seg, codes, code_stride, norms, norm_stride, n, out,
                                               d, norms_out);
      default:
        return decode_tile_bits<4, kApplyNorm>(seg, codes, code_stride, norms, norm_stride, n, out,
                                               d, norms_out);
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
