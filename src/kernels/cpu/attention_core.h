// The shared body of every fast CPU attention kernel (dense and on codes), written once as a
// template over
//   Isa:   the vector primitives (scalar in attention_scalar.cc, AVX2 in attention_avx2.cc);
//   D:     head_dim as a compile-time constant (0: runtime head_dim, the generic fallback);
//   Tiles: where keys and values come from. tiles.keys(h, t0, n, scratch) returns the rows of
//          tokens [t0, t0 + n) of KV head h as floats [n, d] in the frame the queries are in
//          (dense: the stored values; TurboQuant: norm * centroids in the rotated frame).
//          A tile is at most kTileTokens tokens: the only decoded state is that per-tile
//          scratch, never a copy of the cache. tiles.prefetch(h, t0, n) hints the tokens
//          read kPrefetchTiles tiles ahead.
// A caller may run some items its own way (attend_split_k_items): the TurboQuant decode
// kernel (attention_codes_decode.h) scores and accumulates one query's rows straight from
// the codes.
//
// Work is split (docs/kernels.md, "CPU attention") into items = (KV head, block of queries, key
// split). An item runs one pass over its keys for every query row of its KV head's group (GQA: the
// G query heads of a KV head share each decoded tile) and keeps an online-softmax state {m, l, acc}
// per row; split partials are merged in a fixed order, so results do not depend on the thread
// count. Everything here is templated on Isa: each instantiation stays in its own TU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/attention.h"

// Internal linkage on purpose: every ISA's translation unit compiles these templates and
// inline helpers with its own flags (-mavx2 or none), and must not share one copy with another.
namespace turbokv::attention_detail {
namespace {

constexpr int kTileTokens = 16;        // keys decoded and scored together
constexpr int kQueryBlock = 16;        // queries per work item (times G rows)
// Keys per split when one query block covers all queries (decode): as many as give about
// kSplitItems items over the KV heads, rounded up to kMinSplitTokens, within
// [kMinSplitTokens, kMaxSplitTokens]. An item pays a fixed cost (queries and tables prepared,
// sums reordered, a state allocated and merged): with 8 KV heads on 2 threads (bench attention,
// AVX2) this policy ran TurboQuant 3.5 decode 1.25x / 1.33x faster at 16k / 64k keys than
// 512-token splits did, dense f16 1.0x / 1.1x. The split depends on the problem's shape only,
// never on the thread count; ~32 items keep up to 32 threads busy.
constexpr int64_t kMinSplitTokens = 512;
constexpr int64_t kMaxSplitTokens = 8192;
constexpr int64_t kSplitItems = 32;
constexpr int kPrefetchTiles = 2;
constexpr int kRowBlock = 4;  // query rows (GQA heads of one query) sharing each loaded element

// A decoded tile: rows [n, d]; scale [n] multiplies each row, nullptr for none.
struct TileRows {
  const float* rows = nullptr;
  const float* scale = nullptr;
};

// Everything an attention call needs besides where K/V come from. q rows are already in the
// tiles' frame; out receives acc / l in that frame.
struct AttendProblem {
  const float* q = nullptr;  // [n_q, n_heads, d]
  float* out = nullptr;      // [n_q, n_heads, d]
  float* lse = nullptr;      // [n_q, n_heads] softmax statistics, or null
  int n_q = 0;
  int64_t q_first_pos = 0;
  int n_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int64_t n_tokens = 0;  // keys held; token t at position k_first_pos + t
  int64_t k_first_pos = 0;
  float scale = 0;
  float logit_softcap = 0;
  int sliding_window = 0;
};

inline AttendProblem make_problem(const AttentionQueries& queries, const AttentionParams& params,
                                  int kv_heads, int head_dim, int64_t n_tokens, int64_t k_first_pos,
                                  const float* q, float* out, float* lse) {
  AttendProblem p;
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.n_q = queries.n_q;
  p.q_first_pos = queries.first_pos;
  p.n_heads = params.n_heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.n_tokens = n_tokens;
  p.k_first_pos = k_first_pos;
  p.scale = params.scale;
  p.logit_softcap = params.logit_softcap;
  p.sliding_window = params.sliding_window;
  return p;
}

// Online-softmax state of `rows` query rows: m (running max score), l (sum of exp(s - m)),
// acc (sum of exp(s - m) * v). merge() folds another partial over disjoint keys into this one.
struct SoftmaxStates {
  int d = 0;
  std::vector<float> m;    // [rows]
  std::vector<float> l;    // [rows]
  std::vector<float> acc;  // [rows, d]

  void reset(int rows, int dim) {
    d = dim;
    m.assign(rows, -std::numeric_limits<float>::infinity());
    l.assign(rows, 0.0f);
    acc.assign(static_cast<size_t>(rows) * dim, 0.0f);
  }

  void merge_row(int r, const SoftmaxStates& other) {
    const float om = other.m[r];
    if (om == -std::numeric_limits<float>::infinity()) return;
    const float new_m = std::max(m[r], om);
    const float a = std::exp(m[r] - new_m);  // 0 when this row saw nothing yet
    const float b = std::exp(om - new_m);
    l[r] = l[r] * a + other.l[r] * b;
    float* x = &acc[static_cast<size_t>(r) * d];
    const float* y = &other.acc[static_cast<size_t>(r) * d];
    for (int c = 0; c < d; ++c) x[c] = x[c] * a + y[c] * b;
    m[r] = new_m;
  }

  void merge(const SoftmaxStates& other) {
    for (int r = 0; r < static_cast<int>(m.size()); ++r) merge_row(r, other);
  }
};

// Keys [k_begin, k_end) (token indices) that any query of [q_begin, q_end) may see.
inline void visible_key_range(const AttendProblem& p, int q_begin, int q_end, int64_t* k_begin,
                              int64_t* k_end) {
  const int64_t first_q_pos = p.q_first_pos + q_begin;
  const int64_t last_q_pos = p.q_first_pos + q_end - 1;
  int64_t lo = 0;
  if (p.sliding_window > 0)
    lo = std::max<int64_t>(lo, first_q_pos - p.sliding_window + 1 - p.k_first_pos);
  *k_begin = lo;
  *k_end = std::clamp<int64_t>(last_q_pos - p.k_first_pos + 1, 0, p.n_tokens);
}

// One item: query rows of KV head h, queries [q_begin, q_end), keys [k_begin, k_end). The G
// rows of one query share its mask; they go through the ISA's block primitives up to
// kRowBlock at a time, so each key / value element loaded serves several rows.
template <class Isa, int D, class Tiles>
void attend_item(const Tiles& tiles, const AttendProblem& p, int h, int q_begin, int q_end,
                 int64_t k_begin, int64_t k_end, SoftmaxStates& state) {
  const int d = D > 0 ? D : p.head_dim;
  const int group = p.n_heads / p.kv_heads;
  state.reset((q_end - q_begin) * group, d);
  alignas(64) float key_scratch[kTileTokens * (D > 0 ? D : 1)];
  alignas(64) float value_scratch[kTileTokens * (D > 0 ? D : 1)];
  std::vector<float> dynamic_scratch(D > 0 ? 0 : 2 * kTileTokens * d);
  float* key_tile_buffer = D > 0 ? key_scratch : dynamic_scratch.data();
  float* value_tile_buffer = D > 0 ? value_scratch : dynamic_scratch.data() + kTileTokens * d;
  alignas(32) float scores[kRowBlock][kTileTokens] = {};   // then exp(s - m)
  alignas(32) float weights[kRowBlock][kTileTokens] = {};  // exp(s - m) * value scale
  float alpha[kRowBlock];
  alignas(32) float key_scale_scratch[kTileTokens] = {};  // entries past n stay finite
  alignas(32) float value_scale_scratch[kTileTokens] = {};
  const float neg_inf = -std::numeric_limits<float>::infinity();

  for (int64_t t0 = k_begin; t0 < k_end; t0 += kTileTokens) {
    const int n = static_cast<int>(std::min<int64_t>(kTileTokens, k_end - t0));
    const int64_t tile_first_pos = p.k_first_pos + t0;
    const int64_t ahead = t0 + kPrefetchTiles * kTileTokens;
    if (ahead < k_end) {
      tiles.prefetch(h, ahead, static_cast<int>(std::min<int64_t>(kTileTokens, k_end - ahead)));
    }
    const TileRows keys = tiles.keys(h, t0, n, key_tile_buffer, key_scale_scratch);
    TileRows values;
    bool values_ready = false;
    for (int qi = q_begin; qi < q_end; ++qi) {
      const int64_t q_pos = p.q_first_pos + qi;
      // Visible tile tokens form one interval [lo, hi).
      int lo = 0;
      const int hi = static_cast<int>(std::clamp<int64_t>(q_pos - tile_first_pos + 1, 0, n));
      if (p.sliding_window > 0) {
        lo = static_cast<int>(
            std::clamp<int64_t>(q_pos - p.sliding_window + 1 - tile_first_pos, 0, n));
      }
      if (lo >= hi) continue;
      for (int g0 = 0; g0 < group; g0 += kRowBlock) {
        const int block = std::min(kRowBlock, group - g0);
        const int first_row = (qi - q_begin) * group + g0;
        const float* q = p.q + (static_cast<int64_t>(qi) * p.n_heads + h * group + g0) * d;
        Isa::template dot_block<D>(block, q, keys.rows, n, d, scores[0]);
        for (int b = 0; b < block; ++b) {
          float* s = scores[b];
          Isa::scale_scores(s, keys.scale, p.scale);
          if (p.logit_softcap > 0) {
            for (int t = 0; t < n; ++t) s[t] = p.logit_softcap * std::tanh(s[t] / p.logit_softcap);
          }
          if (lo > 0 || hi < kTileTokens) {
            for (int t = 0; t < kTileTokens; ++t) {
              if (t < lo || t >= hi) s[t] = neg_inf;
            }
          }
          const int r = first_row + b;
          const float old_m = state.m[r];
          const float new_m = std::max(old_m, Isa::max_score(s));
          alpha[b] = std::exp(old_m - new_m);                 // 0 on the first visible tile
          const float tile_sum = Isa::exp_shifted(s, new_m);  // s := exp(s - new_m)
          state.l[r] = state.l[r] * alpha[b] + tile_sum;
          state.m[r] = new_m;
        }
        if (!values_ready) {
          values = tiles.values(h, t0, n, value_tile_buffer, value_scale_scratch);
          values_ready = true;
        }
        const float* w = scores[0];
        if (values.scale != nullptr) {
          for (int b = 0; b < block; ++b) Isa::multiply(scores[b], values.scale, weights[b]);
          w = weights[0];
        }
        float* acc = &state.acc[static_cast<size_t>(first_row) * d];
        Isa::template accumulate_block<D>(block, acc, alpha, w, values.rows, n, d);
      }
    }
  }
}

// The keys per split (above) of a decode problem with `span` keys per KV head.
inline int64_t split_tokens(int64_t span, int kv_heads) {
  const int64_t even = (span * kv_heads + kSplitItems - 1) / kSplitItems;
  const int64_t rounded = (even + kMinSplitTokens - 1) / kMinSplitTokens * kMinSplitTokens;
  return std::clamp(rounded, kMinSplitTokens, kMaxSplitTokens);
}

// Runs the whole problem: builds items, runs each as run_item(h, q_begin, q_end, k_begin,
// k_end, state) over the thread pool (state: SoftmaxStates of the item's rows), merges
// splits, writes out = acc / l (zero rows where a query saw no key) and lse = m + log(l)
// (-inf there).
template <class RunItem>
void attend_split_k_items(const AttendProblem& p, RunItem&& run_item) {
  const int d = p.head_dim;
  const int group = p.n_heads / p.kv_heads;
  const int n_qblocks = (p.n_q + kQueryBlock - 1) / kQueryBlock;
  struct Item {
    int h, q_begin, q_end;
    int64_t k_begin, k_end;
    int split;  // index among the splits of (h, q block)
  };
  std::vector<Item> items;
  for (int h = 0; h < p.kv_heads; ++h) {
    for (int b = 0; b < n_qblocks; ++b) {
      const int q_begin = b * kQueryBlock;
      const int q_end = std::min(p.n_q, q_begin + kQueryBlock);
      int64_t k_begin, k_end;
      visible_key_range(p, q_begin, q_end, &k_begin, &k_end);
      const int64_t span = std::max<int64_t>(k_end - k_begin, 0);
      const int64_t split = split_tokens(span, p.kv_heads);
      const int64_t splits = n_qblocks == 1 ? std::max<int64_t>(1, (span + split - 1) / split) : 1;
      for (int64_t s = 0; s < splits; ++s) {
        const int64_t lo = k_begin + s * split;
        const int64_t hi = splits == 1 ? k_end : std::min(k_end, lo + split);
        items.push_back(
            Item{h, q_begin, q_end, splits == 1 ? k_begin : lo, hi, static_cast<int>(s)});
      }
    }
  }
  std::vector<SoftmaxStates> states(items.size());
  parallel_tasks(static_cast<int>(items.size()), [&](int i) {
    const Item& it = items[i];
    run_item(it.h, it.q_begin, it.q_end, it.k_begin, it.k_end, states[i]);
  });
  // Items of one (h, q block) are consecutive, split 0 first: merge them in order.
  for (size_t i = 0; i < items.size();) {
    size_t j = i + 1;
    for (; j < items.size() && items[j].split != 0; ++j) states[i].merge(states[j]);
    const Item& it = items[i];
    const SoftmaxStates& st = states[i];
    for (int r = 0; r < (it.q_end - it.q_begin) * group; ++r) {
      const int qi = it.q_begin + r / group;
      const int head = it.h * group + r % group;
      float* o = p.out + (static_cast<int64_t>(qi) * p.n_heads + head) * d;
      const float* acc = &st.acc[static_cast<size_t>(r) * d];
      const float inv = st.l[r] > 0 ? 1.0f / st.l[r] : 0.0f;
      for (int c = 0; c < d; ++c) o[c] = acc[c] * inv;
      if (p.lse != nullptr) {
        p.lse[static_cast<int64_t>(qi) * p.n_heads + head] =
            st.l[r] > 0 ? st.m[r] + std::log(st.l[r]) : -std::numeric_limits<float>::infinity();
      }
    }
    i = j;
  }
}

// attend_split_k_items with every item through attend_item.
template <class Isa, int D, class Tiles>
void attend_split_k(const Tiles& tiles, const AttendProblem& p) {
  attend_split_k_items(
      p, [&](int h, int q_begin, int q_end, int64_t k_begin, int64_t k_end, SoftmaxStates& state) {
        attend_item<Isa, D>(tiles, p, h, q_begin, q_end, k_begin, k_end, state);
      });
}

// Calls fn(std::integral_constant<int, D>) with D = head_dim for the compiled sizes, else D = 0
// (runtime head_dim). The one place head_dim becomes a template parameter (docs/kernels.md,
// "Dispatch").
template <class Fn>
void dispatch_head_dim(int head_dim, Fn&& fn) {
  switch (head_dim) {
    case 64:
      return fn(std::integral_constant<int, 64>{});
    case 80:
      return fn(std::integral_constant<int, 80>{});
    case 96:
      return fn(std::integral_constant<int, 96>{});
    case 112:
      return fn(std::integral_constant<int, 112>{});
    case 128:
      return fn(std::integral_constant<int, 128>{});
    case 160:
      return fn(std::integral_constant<int, 160>{});
    case 192:
      return fn(std::integral_constant<int, 192>{});
    case 256:
      return fn(std::integral_constant<int, 256>{});
    default:
      return fn(std::integral_constant<int, 0>{});
  }
}

// Hints the cache lines of [p, p + n) into the cache (a read that is coming soon).
inline void prefetch_bytes(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < n; i += 64) __builtin_prefetch(c + i, 0, 3);
}

// Tiles of a dense cache: f32 rows are used in place, f16/bf16 rows converted into scratch.
template <class Isa>
struct DenseTiles {
  DenseKVView kv;

  const float* rows(const void* base, int h, int64_t t0, int n, float* scratch) const {
    const int64_t first = (h * kv.head_stride + t0) * kv.head_dim;
    const int64_t count = static_cast<int64_t>(n) * kv.head_dim;
    switch (kv.dtype) {
      case KVDType::kF32:
        return static_cast<const float*>(base) + first;
      case KVDType::kF16:
        Isa::f16_to_f32(static_cast<const uint16_t*>(base) + first, scratch, count);
        return scratch;
      case KVDType::kBF16:
        Isa::bf16_to_f32(static_cast<const uint16_t*>(base) + first, scratch, count);
        return scratch;
    }
    return nullptr;
  }
  TileRows keys(int h, int64_t t0, int n, float* scratch, float*) const {
    return {rows(kv.k, h, t0, n, scratch), nullptr};
  }
  void prefetch(int h, int64_t t0, int n) const {
    const size_t element = kv_dtype_bytes(kv.dtype);
    const size_t offset = (h * kv.head_stride + t0) * kv.head_dim * element;
    prefetch_bytes(static_cast<const char*>(kv.k) + offset, n * kv.head_dim * element);
    prefetch_bytes(static_cast<const char*>(kv.v) + offset, n * kv.head_dim * element);
  }
  TileRows values(int h, int64_t t0, int n, float* scratch, float*) const {
    return {rows(kv.v, h, t0, n, scratch), nullptr};
  }
};

template <class Isa>
void attention_dense_on(const DenseKVView& kv, const AttentionQueries& queries,
                        const AttentionParams& params, float* out, float* lse) {
  const AttendProblem problem = make_problem(queries, params, kv.kv_heads, kv.head_dim, kv.n_tokens,
                                             kv.first_pos, queries.q, out, lse);
  dispatch_head_dim(kv.head_dim, [&](auto head_dim) {
    attend_split_k<Isa, decltype(head_dim)::value>(DenseTiles<Isa>{kv}, problem);
  });
}

}  // namespace
}  // namespace turbokv::attention_detail
