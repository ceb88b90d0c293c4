// CPU attention kernels over one sequence's keys and values, and the parameters they share.
//
//   attention_reference: slow, obvious scalar reference (fp32 accumulation, two-pass softmax).
//                        Every fast kernel is tested against it.
//   attention_dense:     the fast kernel for dense caches (f32/f16/bf16): decode and prefill,
//                        split-K over the keys with an online-softmax merge, GQA-shared passes,
//                        AVX2 or scalar (attention_core.h).
//
// Masks: the query at position p sees the key at position t iff t <= p (causal) and, with a
// sliding window W > 0, t > p - W. Gemma2 logit soft-capping: s = cap * tanh(s / cap).
// GQA: query head h reads KV head h / (n_heads / kv_heads).
//
// Softmax statistics: every kernel can also return, per output row, lse = log sum_t exp(s_t)
// over the keys the row sees (natural log of the softmax denominator, the row's max score
// folded in; s_t after scale and soft-capping; -inf for a row that sees no key). Two
// attentions of the same queries over disjoint key sets (e.g. fp16 sink tokens and the coded
// rest) combine exactly with merge_attention_partials.
#pragma once

#include <cstddef>
#include <cstdint>

namespace turbokv {

struct AttentionParams {
  int n_heads = 0;          // query heads
  float scale = 0;          // score = scale * <q, k>
  float logit_softcap = 0;  // > 0: score = cap * tanh(score / cap) (gemma2)
  int sliding_window = 0;   // 0: global; W > 0: a query at p sees keys in (p - W, p]
};

// Element type of a dense K/V buffer.
enum class KVDType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
const char* kv_dtype_name(KVDType dtype);  // "f32", "f16", "bf16"
size_t kv_dtype_bytes(KVDType dtype);

// Dense keys and values of one sequence, head-major. Key token t of KV head h starts at element
// (h * head_stride + t) * head_dim of k (same for v); token t holds position first_pos + t.
struct DenseKVView {
  KVDType dtype = KVDType::kF32;
  const void* k = nullptr;  // [kv_heads, head_stride, head_dim]
  const void* v = nullptr;  // [kv_heads, head_stride, head_dim]
  int kv_heads = 0;
  int head_dim = 0;
  int64_t head_stride = 0;  // tokens between consecutive heads (>= n_tokens)
  int64_t n_tokens = 0;
  int64_t first_pos = 0;
};

// Queries of one call: q [n_q, n_heads, head_dim], query i at position first_pos + i.
struct AttentionQueries {
  const float* q = nullptr;
  int n_q = 0;
  int64_t first_pos = 0;
};

// True when the query at q_pos may read the key at k_pos under params' masks.
inline bool attention_visible(int64_t q_pos, int64_t k_pos, int sliding_window) {
  return k_pos <= q_pos && (sliding_window <= 0 || k_pos > q_pos - sliding_window);
}

// Instruction set of a fast kernel. Tests run every one; callers take best_attention_isa().
// A kernel asked for an ISA the CPU lacks, or one it has no version for, runs its best
// version below it (kAvx512 -> kAvx2 -> kScalar).
enum class AttentionIsa { kScalar, kAvx2, kAvx512 };
// kAvx512 where cpu_has_avx512(), else kAvx2 where cpu_has_avx2(), else kScalar
// (core/cpu.h: TURBOKV_FORCE_AVX2 and TURBOKV_FORCE_SCALAR select the lower ones).
AttentionIsa best_attention_isa();
const char* attention_isa_name(AttentionIsa isa);  // "scalar", "avx2", "avx512"

// out: [n_q, n_heads, head_dim]. A query that sees no key gets a zero row.
// lse (optional): [n_q, n_heads], the rows' softmax statistics (see above).
void attention_reference(const DenseKVView& kv, const AttentionQueries& queries,
                         const AttentionParams& params, float* out, float* lse = nullptr);

// Same contract as attention_reference. kAvx2 and kAvx512 run the AVX2 version (scalar where
// the CPU lacks AVX2 or head_dim % 8 != 0).
void attention_dense(const DenseKVView& kv, const AttentionQueries& queries,
                     const AttentionParams& params, float* out,
                     AttentionIsa isa = best_attention_isa(), float* lse = nullptr);

// Combines the attentions a and b of the same rows over two disjoint key sets into the
// attention over their union, exactly up to fp32 rounding:
//   lse = log(e^lse_a + e^lse_b),  out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
// A side with lse = -inf (it saw no key) contributes nothing; both -inf give a zero row and
// lse = -inf. out_a, out_b, out: [rows, head_dim]; lse_a, lse_b, lse: [rows]. out may be
// out_a or out_b and lse may be lse_a or lse_b (in place); lse may be null.
void merge_attention_partials(const float* out_a, const float* lse_a, const float* out_b,
                              const float* lse_b, int64_t rows, int head_dim, float* out,
                              float* lse);

}  // namespace turbokv
