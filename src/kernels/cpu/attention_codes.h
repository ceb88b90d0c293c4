// Attention on quantized caches.
//
// TurboQuant codes (docs/design.md, "Attention on codes"): each query row is rotated
// once into its KV head's codec frame, keys are scored and values accumulated on the codes
// (norm * centroid, decoded one tile of kTileTokens tokens at a time into scratch — never a
// dequantized copy of the cache), and each output row is rotated back once. Same split-K
// core, masks and GQA sharing as attention_dense (attention_core.h).
//
// Uniform affine codes (the baseline scheme): no rotation; each tile of codes is decoded as
// scale * q + min per group into the same per-tile scratch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "quant/codec.h"
#include "quant/codec_uniform.h"

namespace turbokv {

// One tensor (keys or values) of one sequence, head-major. Vector t of KV head h: codes at
// codes + (h * head_stride + t) * code_bytes, its norms_per_vector() fp16 norms at
// norms + (h * head_stride + t) * norms_per_vector(). codecs[h] codes KV head h (all heads may
// share one codec); the codes buffer must be readable 4 bytes past the last vector.
struct CodedTensorView {
  const uint8_t* codes = nullptr;   // [kv_heads, head_stride, code_bytes]
  const uint16_t* norms = nullptr;  // [kv_heads, head_stride, norms_per_vector]
  const quant::TurboQuantCodec* const* codecs = nullptr;  // [kv_heads]
};

struct TurboQuantKVView {
  CodedTensorView keys;
  CodedTensorView values;
  int kv_heads = 0;
  int head_dim = 0;
  int64_t head_stride = 0;  // tokens between consecutive heads
  int64_t n_tokens = 0;
  int64_t first_pos = 0;
};

// How decode on the codes multiplies the tensors whose codebook has 16 centroids (4 bits),
// which AVX2 cannot look up in one fp32 instruction:
//   kInt8: the centroids are looked up as bytes, 32 per vpshufb, and multiplied with 8-bit
//     queries (keys) or 8-bit softmax weights (values) by vpmaddubsw into 32-bit sums; the
//     rounding is a fraction of the codec's own error (docs/kernels.md, "CPU attention").
//   kExact: fp32 products on the exact codebook, like every other codebook size.
// Default kInt8; kExact when TURBOKV_EXACT_ATTENTION=1 or TURBOKV_F32_ACTIVATIONS=1 (the
// reference mode) is set. Prefill, the scalar path and codebooks of 1-3 bits are always exact.
enum class CodeProducts { kExact, kInt8 };
CodeProducts code_products();
void set_code_products(CodeProducts products);  // for tests and benchmarks

// Same contract as attention_reference over the dequantized keys and values.
void attention_turboquant(const TurboQuantKVView& kv, const AttentionQueries& queries,
                          const AttentionParams& params, float* out,
                          AttentionIsa isa = best_attention_isa(), float* lse = nullptr);

// Uniform codes of one sequence, head-major: vector t of KV head h has its codes at
// codes + (h * head_stride + t) * codec->code_bytes() and its [groups, 2] fp16 (scale, min)
// at params + (h * head_stride + t) * codec->params_per_vector(). Codes readable 4 bytes past
// the last vector.
struct UniformTensorView {
  const uint8_t* codes = nullptr;    // [kv_heads, head_stride, code_bytes]
  const uint16_t* params = nullptr;  // [kv_heads, head_stride, groups, 2]
  const quant::UniformCodec* codec = nullptr;
};

struct UniformKVView {
  UniformTensorView keys;
  UniformTensorView values;
  int kv_heads = 0;
  int head_dim = 0;
  int64_t head_stride = 0;
  int64_t n_tokens = 0;
  int64_t first_pos = 0;
};

// Same contract as attention_reference over the dequantized keys and values.
void attention_uniform(const UniformKVView& kv, const AttentionQueries& queries,
                       const AttentionParams& params, float* out,
                       AttentionIsa isa = best_attention_isa(), float* lse = nullptr);

}  // namespace turbokv
