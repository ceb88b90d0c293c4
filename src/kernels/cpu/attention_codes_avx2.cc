// Attention on TurboQuant codes, AVX2 path. Decode (one query) runs the kernel of
// attention_codes_decode.h with vpermps codebook lookups (Avx2Lookup). Prefill decodes a tile
// of codes of up to 4 bits into scratch once for all its queries, 8 codes per broadcast load,
// vpsrlvd and lookup; wider codes and split codecs go through the codec's decode_rotated.
#include <cstring>

#include "core/half.h"
#include "kernels/cpu/attention_codes_decode.h"
#include "kernels/cpu/attention_entry.h"

namespace turbokv::attention_detail {
namespace {

template <int B, bool kApplyNorm>
void decode_tile_bits(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                      const uint16_t* norms, int norm_stride, int n, float* out, int d,
                      float* norms_out) {
  const CodeTable table = make_code_table(seg.centroids, B);
  const int groups = seg.dim / 8;
  for (int i = 0; i < n; ++i) {
    const uint8_t* vector_codes = codes + i * code_stride;
    float* row = out + static_cast<int64_t>(i) * d;
    const float norm = _cvtsh_ss(norms[i * norm_stride]);
    const __m256 scale = _mm256_set1_ps(norm);
    if constexpr (!kApplyNorm) norms_out[i] = norm;
#pragma GCC unroll 4
    for (int g = 0; g < groups; ++g) {
      const __m256 c = Avx2Lookup::group<B>(vector_codes + g * B, table);
      _mm256_storeu_ps(row + 8 * g, kApplyNorm ? _mm256_mul_ps(c, scale) : c);
    }
  }
}

struct RegisterDecoder {
  static void decode_tile(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                          const uint16_t* norms, int norm_stride, int n, float* out, int d,
                          float* norms_out) {
    if (seg.dim % 8 != 0 || seg.bits > 4) {
      return CodecDecoder::decode_tile(seg, codes, code_stride, norms, norm_stride, n, out, d,
                                       norms_out);
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
    const __m256i idx = _mm256_and_si256(group_indices(codes + g * B, shifts), mask);
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
                            const AttentionParams& params, float* out, float* lse) {
  attention_uniform_on<Avx2Isa, UniformRegisterDecoder>(kv, queries, params, out, lse);
}

void attention_turboquant_avx2(const TurboQuantKVView& kv, const AttentionQueries& queries,
                               const AttentionParams& params, float* out, float* lse) {
  attention_turboquant_on<Avx2Isa, RegisterDecoder, CodeDecodeKernel<Avx2Lookup>>(
      kv, queries, params, out, lse, quant::Isa::kAvx2);
}

}  // namespace turbokv::attention_detail
