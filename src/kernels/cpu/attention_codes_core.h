// Tile source of the attention core for TurboQuant codes, and the whole on-codes attention
// as a template over the ISA (instantiated in attention_codes_scalar.cc / _avx2.cc).
// A KV head's codec is one MSE codec or a split codec (two MSE codecs over the two halves of
// the rotated frame); both become a list of segments, each decoded as norm * centroid[code].
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/attention_codes.h"
#include "kernels/cpu/attention_core.h"
#include "quant/codec_mse.h"
#include "quant/codec_split.h"

// Internal linkage on purpose: every ISA's translation unit compiles these templates and
// inline helpers with its own flags (-mavx2 or none), and must not share one copy with another.
namespace turbokv::attention_detail {
namespace {

// One MSE-coded part of a vector: its codes start code_offset bytes into the vector's codes,
// its norm is norm word norm_index, and it fills frame [frame_offset, frame_offset + dim).
struct CodeSegment {
  const quant::MseCodec* codec = nullptr;
  size_t code_offset = 0;
  int norm_index = 0;
  int frame_offset = 0;
  int dim = 0;
  int bits = 0;
  alignas(32) float centroids[16] = {};  // the codebook, zero-padded (bits <= 4 only)
};

struct VectorDecoder {
  CodeSegment segments[2];
  int n_segments = 0;
  size_t code_bytes = 0;
  int norms_per_vector = 0;
  bool fusable = false;  // one segment of <= 4 bits, dim % 8 == 0: lookups in registers
};

inline VectorDecoder make_vector_decoder(const quant::TurboQuantCodec& codec) {
  VectorDecoder decoder;
  decoder.code_bytes = codec.code_bytes();
  decoder.norms_per_vector = codec.norms_per_vector();
  auto add = [&](const quant::MseCodec& mse, size_t code_offset, int norm_index, int frame_offset) {
    CodeSegment& s = decoder.segments[decoder.n_segments++];
    s.codec = &mse;
    s.code_offset = code_offset;
    s.norm_index = norm_index;
    s.frame_offset = frame_offset;
    s.dim = mse.dim();
    s.bits = mse.int_bits();
    const auto& c = mse.codebook().centroids;
    if (s.bits <= 4) std::copy(c.begin(), c.end(), s.centroids);
  };
  if (const auto* mse = dynamic_cast<const quant::MseCodec*>(&codec)) {
    add(*mse, 0, 0, 0);
  } else {
    const auto& split = dynamic_cast<const quant::SplitCodec&>(codec);
    add(split.high(), 0, 0, 0);
    add(split.low(), split.high().code_bytes(), 1, split.high_dim());
  }
  const CodeSegment& first = decoder.segments[0];
  decoder.fusable = decoder.n_segments == 1 && first.bits <= 4 && first.dim % 8 == 0;
  return decoder;
}

// Decoder: a struct with
//   static void decode_tile(const CodeSegment&, const uint8_t* codes, size_t code_stride,
//                           const uint16_t* norms, int norm_stride, int n, float* out, int d,
//                           float* norms_out)
// writing, for token i < n, the centroids[code] of the segment's dim codes to out + i * d:
// times norm_i when norms_out is null (what MseCodec::decode_rotated computes per vector),
// else unscaled, with norm_i stored to norms_out[i].
// The portable Decoder: each vector through the codec's decode_rotated.
struct CodecDecoder {
  static void decode_tile(const CodeSegment& seg, const uint8_t* codes, size_t code_stride,
                          const uint16_t* norms, int norm_stride, int n, float* out, int d,
                          float* norms_out) {
    const uint16_t unit_norm = 0x3C00;  // 1.0 in fp16
    for (int i = 0; i < n; ++i) {
      const uint16_t norm = norms[i * norm_stride];
      if (norms_out != nullptr) norms_out[i] = f16_to_f32(norm);
      seg.codec->decode_rotated(codes + i * code_stride, norms_out != nullptr ? unit_norm : norm,
                                out + i * d);
    }
  }
};

template <class Decoder>
struct CodeTiles {
  const TurboQuantKVView* kv;
  const VectorDecoder* key_decoders;    // [kv_heads]
  const VectorDecoder* value_decoders;  // [kv_heads]

  // One-segment codecs hand their norms to the core as the per-token scale; a split codec's
  // two norms are applied while decoding.
  TileRows decode(const CodedTensorView& tensor, const VectorDecoder& decoder, int64_t first_row,
                  int n, float* scratch, float* scale_scratch) const {
    const uint8_t* codes = tensor.codes + first_row * decoder.code_bytes;
    const uint16_t* norms = tensor.norms + first_row * decoder.norms_per_vector;
    float* norms_out = decoder.n_segments == 1 ? scale_scratch : nullptr;
    for (int s = 0; s < decoder.n_segments; ++s) {
      const CodeSegment& seg = decoder.segments[s];
      Decoder::decode_tile(seg, codes + seg.code_offset, decoder.code_bytes, norms + seg.norm_index,
                           decoder.norms_per_vector, n, scratch + seg.frame_offset, kv->head_dim,
                           norms_out);
    }
    return {scratch, norms_out};
  }
  TileRows keys(int h, int64_t t0, int n, float* scratch, float* scale_scratch) const {
    return decode(kv->keys, key_decoders[h], h * kv->head_stride + t0, n, scratch, scale_scratch);
  }
  TileRows values(int h, int64_t t0, int n, float* scratch, float* scale_scratch) const {
    return decode(kv->values, value_decoders[h], h * kv->head_stride + t0, n, scratch,
                  scale_scratch);
  }
  void prefetch(int h, int64_t t0, int n) const {
    const int64_t row = h * kv->head_stride + t0;
    for (const auto& [tensor, decoder] :
         {std::pair{&kv->keys, &key_decoders[h]}, std::pair{&kv->values, &value_decoders[h]}}) {
      prefetch_bytes(tensor->codes + row * decoder->code_bytes, n * decoder->code_bytes);
      prefetch_bytes(tensor->norms + row * decoder->norms_per_vector,
                     n * decoder->norms_per_vector * sizeof(uint16_t));
    }
  }
};

// Decoder: static void decode(const quant::UniformCodec&, const uint8_t* codes,
// const uint16_t* params, float* out) writing the dequantized vector (UniformCodec::dequantize).
template <class Decoder>
struct UniformTiles {
  const UniformKVView* kv;

  const float* decode(const UniformTensorView& tensor, int h, int64_t t0, int n,
                      float* scratch) const {
    const quant::UniformCodec& codec = *tensor.codec;
    for (int i = 0; i < n; ++i) {
      const int64_t row = h * kv->head_stride + t0 + i;
      Decoder::decode(codec, tensor.codes + row * codec.code_bytes(),
                      tensor.params + row * codec.params_per_vector(),
                      scratch + static_cast<int64_t>(i) * kv->head_dim);
    }
    return scratch;
  }
  TileRows keys(int h, int64_t t0, int n, float* scratch, float*) const {
    return {decode(kv->keys, h, t0, n, scratch), nullptr};
  }
  TileRows values(int h, int64_t t0, int n, float* scratch, float*) const {
    return {decode(kv->values, h, t0, n, scratch), nullptr};
  }
  void prefetch(int h, int64_t t0, int n) const {
    const int64_t row = h * kv->head_stride + t0;
    for (const UniformTensorView* tensor : {&kv->keys, &kv->values}) {
      const quant::UniformCodec& codec = *tensor->codec;
      prefetch_bytes(tensor->codes + row * codec.code_bytes(), n * codec.code_bytes());
      prefetch_bytes(tensor->params + row * codec.params_per_vector(),
                     n * codec.params_per_vector() * sizeof(uint16_t));
    }
  }
};

// No decode kernel: every item goes through the tiles.
struct NoFastDecode {
  static bool eligible(const VectorDecoder&, const VectorDecoder&) { return false; }
  template <int D>
  static void run(const TurboQuantKVView&, const VectorDecoder&, const VectorDecoder&,
                  const AttendProblem&, int, const float*, int64_t, int64_t, SoftmaxStates&) {}
};

// Rotate the queries into each KV head's key frame, run the core on codes, rotate each output
// row back out of its KV head's value frame. FastDecode (NoFastDecode, or CodeDecodeKernel of
// attention_codes_decode.h) runs the items of a single query on the KV heads whose codecs it
// is eligible for: static bool eligible(key decoder, value decoder) and
// template <int D> static void run(kv, key decoder, value decoder, problem, h, q rows,
// k_begin, k_end, state) (D = head_dim or 0, as dispatch_head_dim gives it).
template <class Isa, class Decoder, class FastDecode = NoFastDecode>
void attention_turboquant_on(const TurboQuantKVView& kv, const AttentionQueries& queries,
                             const AttentionParams& params, float* out, float* lse,
                             quant::Isa codec_isa) {
  const int d = kv.head_dim;
  const int group = params.n_heads / kv.kv_heads;
  std::vector<VectorDecoder> key_decoders, value_decoders;
  for (int h = 0; h < kv.kv_heads; ++h) {
    key_decoders.push_back(make_vector_decoder(*kv.keys.codecs[h]));
    value_decoders.push_back(make_vector_decoder(*kv.values.codecs[h]));
  }
  const int64_t rows = static_cast<int64_t>(queries.n_q) * params.n_heads;
  std::vector<float> rotated_q(rows * d);    // [n_q, n_heads, d] in the key frames
  std::vector<float> rotated_out(rows * d);  // [n_q, n_heads, d] in the value frames
  parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int h = static_cast<int>(r % params.n_heads) / group;
      kv.keys.codecs[h]->rotate_query(queries.q + r * d, &rotated_q[r * d], codec_isa);
    }
  });
  const AttendProblem problem =
      make_problem(queries, params, kv.kv_heads, d, kv.n_tokens, kv.first_pos, rotated_q.data(),
                   rotated_out.data(), lse);
  const CodeTiles<Decoder> tiles{&kv, key_decoders.data(), value_decoders.data()};
  std::vector<char> fast(kv.kv_heads);  // [kv_heads]: decode items of head h use FastDecode
  for (int h = 0; h < kv.kv_heads; ++h)
    fast[h] = FastDecode::eligible(key_decoders[h], value_decoders[h]);
  dispatch_head_dim(d, [&](auto head_dim) {
    attend_split_k_items(problem, [&](int h, int q_begin, int q_end, int64_t k_begin, int64_t k_end,
                                      SoftmaxStates& state) {
      if (q_end - q_begin == 1 && fast[h]) {
        const float* q =
            problem.q + (static_cast<int64_t>(q_begin) * params.n_heads + h * group) * d;
        FastDecode::template run<decltype(head_dim)::value>(kv, key_decoders[h], value_decoders[h],
                                                            problem, h, q, k_begin, k_end, state);
      } else {
        attend_item<Isa, decltype(head_dim)::value>(tiles, problem, h, q_begin, q_end, k_begin,
                                                    k_end, state);
      }
    });
  });
  parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int h = static_cast<int>(r % params.n_heads) / group;
      kv.values.codecs[h]->unrotate(&rotated_out[r * d], out + r * d, codec_isa);
    }
  });
}

template <class Isa, class Decoder>
void attention_uniform_on(const UniformKVView& kv, const AttentionQueries& queries,
                          const AttentionParams& params, float* out, float* lse) {
  const AttendProblem problem = make_problem(queries, params, kv.kv_heads, kv.head_dim, kv.n_tokens,
                                             kv.first_pos, queries.q, out, lse);
  dispatch_head_dim(kv.head_dim, [&](auto head_dim) {
    attend_split_k<Isa, decltype(head_dim)::value>(UniformTiles<Decoder>{&kv}, problem);
  });
}

}  // namespace
}  // namespace turbokv::attention_detail
