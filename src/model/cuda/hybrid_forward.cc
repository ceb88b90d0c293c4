// HybridForward (hybrid_forward.h): weight upload, the per-kind token mixing, the feed-forward
// and per-layer blocks, and the logits.
#include "model/cuda/hybrid_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/hybrid_ops.h"
#include "kernels/cuda/linear_attention.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/qmatmul.h"
#include "kv/recurrent_state.h"
#include "model/cuda/device_latent_cache.h"
#include "model/cuda/device_recurrent_state.h"
#include "model/rope_scaling.h"

namespace turbokv::cuda {
namespace {

constexpr int64_t kLogitRows = 64;

bool plain_attention_layer(const ModelConfig& c, int l) {
  if (c.layer_kind[size_t(l)] != LayerKind::kAttention) return false;
  const AttentionLayerConfig& a = c.attention[size_t(l)];
  return a.kv_source < 0 && !a.values_from_keys && a.num_heads == c.num_heads &&
         a.num_kv_heads == c.num_kv_heads && a.head_dim == c.head_dim;
}

// A dense weight matrix on the GPU in its stored dtype.
struct DenseMatrix {
  DeviceBuffer<uint8_t> data;
  Elem elem = Elem::kF32;
  int64_t rows = 0, cols = 0;
  const void* ptr() const { return data.data(); }
};

Elem elem_of(DType d, const char* what) {
  switch (d) {
    case DType::F32:
      return Elem::kF32;
    case DType::F16:
      return Elem::kF16;
    case DType::BF16:
      return Elem::kBF16;
    default:
      break;
  }
  throw Unsupported(str_cat("--device cuda: ", what, " weights of dtype ", dtype_name(d),
                            " have no GPU path for this model (F32, F16, BF16 are supported)"));
}

// The row-wise concatenation of dense parts of one dtype and width.
DenseMatrix upload(std::initializer_list<const WeightMatrix*> parts, size_t* total) {
  DenseMatrix m;
  const WeightMatrix& first = **parts.begin();
  m.cols = first.cols;
  for (const WeightMatrix* p : parts) {
    if (p->format != WeightFormat::kDense) {
      throw Unsupported(
          "--device cuda: quantized weights (GGUF, MLX) of qwen3_5, gemma4_text and "
          "deepseek_v3 models have no GPU path yet (dense F32, F16, BF16 weights do)");
    }
    if (p->cols != m.cols || p->dtype != first.dtype) {
      throw Unsupported("--device cuda: fused projections of other widths or dtypes");
    }
    m.rows += p->rows;
  }
  const bool widen = f32_reference_mode();  // fp32 weights, fp32 activations
  m.elem = elem_of(first.dtype, "dense");
  if (widen) m.elem = Elem::kF32;
  const size_t row_bytes = size_t(m.cols) * elem_bytes(m.elem);
  m.data = DeviceBuffer<uint8_t>(size_t(m.rows) * row_bytes);
  upload_dense_parts(parts, widen, m.data.data());
  *total += m.data.bytes();
  return m;
}

DeviceBuffer<float> upload(const std::vector<float>& v, size_t* total) {
  *total += v.size() * sizeof(float);
  return DeviceBuffer<float>::upload(v);
}

const float* or_null(const DeviceBuffer<float>& b) {
  return b.size() > 0 ? b.data() : nullptr;
}

float round_to(float v, DType dtype) {
  if (dtype == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

struct Mlp {
  DenseMatrix gate_up, down;  // [2I, H], [H, I]
  DeviceBuffer<float> gate_bias, up_bias, down_bias;
  int64_t inter = 0;
};

Mlp upload_mlp(const MlpWeights& w, size_t* total) {
  Mlp m;
  m.gate_up = upload({&w.gate, &w.up}, total);
  m.down = upload({&w.down}, total);
  m.gate_bias = upload(w.gate_bias, total);
  m.up_bias = upload(w.up_bias, total);
  m.down_bias = upload(w.down_bias, total);
  m.inter = w.gate.rows;
  return m;
}

struct Layer {
  DeviceBuffer<float> input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  // Attention.
  DeviceBuffer<float> q_norm, k_norm, qkv_bias, o_bias;
  DenseMatrix q, k, v, o;
  // Linear attention.
  DenseMatrix la_qkv, la_z, la_b, la_a, la_out;
  DeviceBuffer<float> conv, a_log, dt_bias, la_norm;
  // MLA.
  DenseMatrix q_a, q_b, kv_a;
  DeviceBuffer<float> q_a_norm, kv_a_norm;
  std::vector<DenseMatrix> absorb, expand;
  // Feed-forward.
  Mlp mlp;
  bool moe = false;
  DenseMatrix router;
  std::vector<Mlp> experts;
  bool shared_expert = false;
  Mlp shared;
  DenseMatrix shared_gate;  // [1, H]: rows == 0 when the shared expert is not gated
  // Per-layer inputs.
  DenseMatrix per_layer_gate, per_layer_projection;
  DeviceBuffer<float> per_layer_norm;
  float layer_scalar = 1;
};

struct Rope {
  DeviceBuffer<float> inv_freq;
  float attention_scaling = 1;
  int rotary_dim = 0;
};

// Growable device scratch by slot; growing waits for the stream (the old buffer may be in use).
class Scratch {
 public:
  float* get(int slot, int64_t count, cudaStream_t stream) {
    if (slot >= int(buffers_.size())) buffers_.resize(size_t(slot) + 1);
    DeviceBuffer<float>& b = buffers_[size_t(slot)];
    if (size_t(count) > b.size()) {
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
      b = DeviceBuffer<float>(std::max<size_t>(size_t(count), 2 * b.size()));
    }
    return b.data();
  }

 private:
  std::vector<DeviceBuffer<float>> buffers_;
};

enum Slot : int {
  kX,
  kNorm,
  kOut,
  kQkv,
  kQg,
  kGate,
  kQ,
  kK,
  kV,
  kAttn,
  kNarrow,
  kMixed,
  kConv,
  kZ,
  kA,
  kB,
  kCore,
  kLatent,
  kTmp,
  kTmp2,
  kRopeIn,
  kQl,
  kAtt,
  kOv,
  kGateUp,
  kAct,
  kMlpOut,
  kRouter,
  kMoeOut,
  kExpertX,
  kExpertGateUp,
  kExpertAct,
  kExpertOut,
  kPli,
  kPliTok,
  kPliGate,
  kPliAct,
  kBranch,
  kLogits,
  kOnes,
  kWorkspace,
  kSmall,
};

DeviceKVCache& device_kv(KVCache* cache, int layer) {
  auto* d = dynamic_cast<DeviceKVCache*>(cache);
  if (d == nullptr) {
    throw InvalidArgument(str_cat("layer ", layer, ": the CUDA model needs GPU caches (got a ",
                                  cache->type_name(), " cache)"));
  }
  return *d;
}

}  // namespace

bool needs_hybrid_forward(const ModelConfig& c) {
  for (int l = 0; l < c.num_layers; ++l) {
    if (!plain_attention_layer(c, l)) return true;
  }
  return c.attention_output_gate || c.v_norm || c.per_layer_input_dim > 0 || c.layer_scalar ||
         !c.intermediate_per_layer.empty() ||
         (c.num_experts > 0 &&
          (c.moe_routing != MoeRouting::kSoftmaxTopK || c.shared_expert_intermediate > 0));
}

std::string hybrid_unsupported_reason(const ModelConfig& c) {
  if (c.rope.type == "dynamic" || (c.rope_local && c.rope_local->type == "dynamic")) {
    return "dynamic NTK RoPE in hybrid models";
  }
  if (c.qkv_bias && c.attention_output_gate) return "attention output gates with q/k/v biases";
  if (c.fused_qkv || c.fused_gate_up) return "fused projections in hybrid models";
  if (c.attn_logit_softcap > 0) return "attention logit soft-capping in hybrid models";
  return "";
}

struct HybridForward::Impl {
  const DecoderModel& host;
  const ModelConfig& c;
  cudaStream_t stream;
  const Gemm& gemm;
  int max_tokens;
  size_t weight_bytes = 0;

  DenseMatrix embed, lm_head_own, per_layer_embed, per_layer_model_projection;
  const DenseMatrix* lm_head = nullptr;
  DeviceBuffer<float> final_norm, per_layer_projection_norm;
  std::vector<Layer> layers;
  std::map<std::pair<bool, int>, Rope> ropes;  // (local, rotary head dim)
  Scratch scratch;
  DeviceBuffer<int32_t> d_tokens, d_positions, d_pli_ids, d_rows;
  std::vector<float> host_logits;

  Impl(const DecoderModel& h, cudaStream_t s, const Gemm& g, int max_step_tokens)
      : host(h), c(h.config()), stream(s), gemm(g), max_tokens(max_step_tokens) {}

  float* buf(int slot, int64_t count) {
    return scratch.get(slot, std::max<int64_t>(count, 1), stream);
  }

  void upload_weights();
  const Rope& rope(bool local, int dim);

  // y [m, w.rows] (row stride ldy) = x [m, w.cols] fp32 · wᵀ.
  void linear(const DenseMatrix& w, const float* x, int64_t m, float* y, int64_t ldy) {
    const void* in = x;
    if (w.elem != Elem::kF32) {
      void* narrow = buf(kNarrow, (m * w.cols + 1) / 2 + 1);
      cast(x, m * w.cols, narrow, w.elem, stream);
      in = narrow;
    }
    gemm.run(in, w.ptr(), w.elem, m, w.rows, w.cols, y, ldy);
  }
  template <typename T>
  const T* put(DeviceBuffer<T>& d, const std::vector<T>& h) {
    if (d.size() < h.size()) {
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
      d = DeviceBuffer<T>(std::max(h.size(), 2 * d.size()));
    }
    if (!h.empty()) {
      TURBOKV_CUDA_CHECK(cudaMemcpyAsync(d.data(), h.data(), h.size() * sizeof(T),
                                         cudaMemcpyHostToDevice, stream));
    }
    return d.data();
  }

  // Attention of n_q device query rows [n_q, heads, head_dim] at the cache's last n_q positions.
  void attend(const DeviceKVCache& cache, const float* q, int n_q, int heads, int window,
              float* out);

  void run_step(const std::vector<ChunkSlice>& slices);
  void attention_layer(int l, const std::vector<SequenceRows>& rows, const float* xn, int64_t T,
                       const int32_t* positions, float* out);
  void linear_attention_layer(int l, const std::vector<SequenceRows>& rows, const float* xn,
                              int64_t T, float* out);
  void mla_layer(int l, const std::vector<SequenceRows>& rows, const float* xn, int64_t T,
                 const int32_t* positions, float* out);
  void mlp(const Mlp& m, const float* xn, int64_t T, float* out, int act_slot, int gu_slot);
  void moe(const Layer& L, const float* xn, int64_t T, float* out);
};

void HybridForward::Impl::upload_weights() {
  size_t* total = &weight_bytes;
  embed = upload({&host.embedding()}, total);
  if (c.tie_word_embeddings) {
    lm_head = &embed;
  } else {
    lm_head_own = upload({&host.lm_head()}, total);
    lm_head = &lm_head_own;
  }
  final_norm = upload(host.final_norm(), total);
  if (c.per_layer_input_dim > 0) {
    per_layer_embed = upload({&host.per_layer_embedding()}, total);
    per_layer_model_projection = upload({&host.per_layer_model_projection()}, total);
    per_layer_projection_norm = upload(host.per_layer_projection_norm(), total);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& W = host.layers()[size_t(l)];
    Layer d;
    d.input_norm = upload(W.input_norm, total);
    d.post_attention_norm = upload(W.post_attention_norm, total);
    d.pre_feedforward_norm = upload(W.pre_feedforward_norm, total);
    d.post_feedforward_norm = upload(W.post_feedforward_norm, total);
    switch (c.layer_kind[size_t(l)]) {
      case LayerKind::kAttention: {
        const AttentionLayerConfig& a = c.attention[size_t(l)];
        const int64_t q_dim = int64_t(a.num_heads) * a.head_dim;
        const int64_t kv_dim = int64_t(a.num_kv_heads) * a.head_dim;
        d.q_norm = upload(W.q_norm, total);
        d.k_norm = upload(W.k_norm, total);
        d.q = upload({&W.q}, total);
        if (a.kv_source < 0) {
          d.k = upload({&W.k}, total);
          if (!a.values_from_keys) d.v = upload({&W.v}, total);
        }
        d.o = upload({&W.o}, total);
        d.o_bias = upload(W.o_bias, total);
        if (c.qkv_bias) {
          std::vector<float> bias = W.q_bias;
          auto add = [&](const std::vector<float>& b) {
            if (b.empty()) {
              bias.insert(bias.end(), size_t(kv_dim), 0.0f);
            } else {
              bias.insert(bias.end(), b.begin(), b.end());
            }
          };
          if (bias.empty()) bias.assign(size_t(q_dim), 0.0f);
          add(W.k_bias);
          add(a.values_from_keys ? W.k_bias : W.v_bias);
          d.qkv_bias = upload(bias, total);
        }
        break;
      }
      case LayerKind::kLinearAttention: {
        const LinearAttentionWeights& w = W.linear;
        d.la_qkv = upload({&w.qkv}, total);
        d.la_z = upload({&w.z}, total);
        d.la_b = upload({&w.b}, total);
        d.la_a = upload({&w.a}, total);
        d.la_out = upload({&w.out}, total);
        d.conv = upload(w.conv, total);
        d.a_log = upload(w.a_log, total);
        d.dt_bias = upload(w.dt_bias, total);
        d.la_norm = upload(w.norm, total);
        break;
      }
      case LayerKind::kMla: {
        const MlaWeights& w = *W.mla;
        if (c.mla.q_lora_rank > 0) {
          d.q_a = upload({&w.q_a}, total);
          d.q_a_norm = upload(w.q_a_norm, total);
          d.q_b = upload({&w.q_b}, total);
        } else {
          d.q = upload({&w.q}, total);
        }
        d.kv_a = upload({&w.kv_a}, total);
        d.kv_a_norm = upload(w.kv_a_norm, total);
        for (const WeightMatrix& m : w.absorb) d.absorb.push_back(upload({&m}, total));
        for (const WeightMatrix& m : w.expand) d.expand.push_back(upload({&m}, total));
        d.o = upload({&w.o}, total);
        break;
      }
    }
    if (W.moe) {
      d.moe = true;
      d.router = upload({&W.moe->router}, total);
      for (const MlpWeights& e : W.moe->experts) d.experts.push_back(upload_mlp(e, total));
      if (W.moe->shared_expert) {
        d.shared_expert = true;
        d.shared = upload_mlp(*W.moe->shared_expert, total);
        if (W.moe->shared_gate.data != nullptr)
          d.shared_gate = upload({&W.moe->shared_gate}, total);
      }
    } else {
      d.mlp = upload_mlp(W.mlp, total);
    }
    if (c.per_layer_input_dim > 0) {
      d.per_layer_gate = upload({&W.per_layer_gate}, total);
      d.per_layer_projection = upload({&W.per_layer_projection}, total);
      d.per_layer_norm = upload(W.per_layer_norm, total);
    }
    d.layer_scalar = W.layer_scalar;
    layers.push_back(std::move(d));
  }
}

const Rope& HybridForward::Impl::rope(bool local, int dim) {
  auto it = ropes.find({local, dim});
  if (it != ropes.end()) return it->second;
  const RopeConfig& config = local && c.rope_local ? *c.rope_local : c.rope;
  const RopeTable t = make_rope_table(config, dim, 1);
  Rope r;
  r.inv_freq = DeviceBuffer<float>::upload(t.inv_freq);
  r.attention_scaling = t.attention_scaling;
  r.rotary_dim = t.rotary_dim();
  return ropes.emplace(std::make_pair(local, dim), std::move(r)).first->second;
}

void HybridForward::Impl::attend(const DeviceKVCache& cache, const float* q, int n_q, int heads,
                                 int window, float* out) {
  const DeviceFormat& format = cache.format();
  const size_t table_entries = std::max<size_t>(1, cache.blocks().size());
  std::vector<const uint8_t*> table(table_entries, cache.zero_block());
  for (size_t i = 0; i < cache.blocks().size(); ++i) {
    if (cache.blocks()[i] != nullptr) table[i] = cache.blocks()[i];
  }
  const int len = int(cache.size());
  const int q_start[2] = {0, n_q};
  const TQSequenceState st = cache.state();
  AttentionOptions o;
  o.n_heads = heads;
  o.scale = c.attention_scale;
  o.logit_softcap = c.attn_logit_softcap;
  o.sliding_window = cache.window() > 0 ? cache.window() : window;
  PagedBatch batch;
  batch.table_stride = int(table_entries);
  batch.batch = 1;
  batch.max_len = len;
  QueryRows rows;
  rows.max_n_q = n_q;
  rows.q = q;
  rows.out = out;
  std::tie(rows.k_new, rows.v_new) = cache.recent_input(n_q);  // recent tokens: the step's rows
  // One upload: [table][seq_len][q_start][state], 16-byte aligned sections.
  auto align = [](size_t n) { return (n + 15) / 16 * 16; };
  const size_t off_len = align(table_entries * sizeof(void*)), off_qs = off_len + 16;
  const size_t off_state = off_qs + 16, bytes = off_state + align(sizeof(TQSequenceState));
  std::vector<uint8_t> blob(bytes, 0);
  std::memcpy(blob.data(), table.data(), table_entries * sizeof(void*));
  std::memcpy(blob.data() + off_len, &len, sizeof(int));
  std::memcpy(blob.data() + off_qs, q_start, sizeof(q_start));
  std::memcpy(blob.data() + off_state, &st, sizeof(st));
  uint8_t* base = reinterpret_cast<uint8_t*>(buf(kSmall, int64_t(bytes / 4) + 4));
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(base, blob.data(), bytes, cudaMemcpyHostToDevice, stream));
  batch.block_table = reinterpret_cast<const uint8_t* const*>(base);
  batch.seq_len = reinterpret_cast<const int*>(base + off_len);
  rows.q_start = reinterpret_cast<const int*>(base + off_qs);
  const auto* states = reinterpret_cast<const TQSequenceState*>(base + off_state);
  const size_t ws_bytes = format.workspace_bytes(batch, rows, o);
  void* ws = buf(kWorkspace, int64_t(ws_bytes / 4) + 4);
  if (format.zeroed_workspace()) TURBOKV_CUDA_CHECK(cudaMemsetAsync(ws, 0, ws_bytes, stream));
  format.attend(batch, states, rows, o, n_q, ws, ws_bytes, stream);
  // The host blob and the small buffer are reused by the next call: finish this one first.
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void HybridForward::Impl::attention_layer(int l, const std::vector<SequenceRows>& rows,
                                          const float* xn, int64_t T, const int32_t* positions,
                                          float* out) {
  const Layer& L = layers[size_t(l)];
  const AttentionLayerConfig& a = c.attention[size_t(l)];
  const int hd = a.head_dim;
  const int64_t q_dim = int64_t(a.num_heads) * hd, kv_dim = int64_t(a.num_kv_heads) * hd;
  const int64_t width = q_dim + 2 * kv_dim;
  const bool own_kv = a.kv_source < 0;
  const float eps = float(c.rms_norm_eps);
  float* qkv = buf(kQkv, T * width);
  // A KV-shared layer computes only q; its k and v columns stay zero (qkv_post reads them).
  if (!own_kv) TURBOKV_CUDA_CHECK(cudaMemsetAsync(qkv, 0, size_t(T * width) * 4, stream));
  float* gate = nullptr;
  if (c.attention_output_gate) {
    float* qg = buf(kQg, T * 2 * q_dim);
    linear(L.q, xn, T, qg, 2 * q_dim);
    gate = buf(kGate, T * q_dim);
    split_query_gate(qg, T, a.num_heads, hd, qkv, width, gate, stream);
  } else {
    linear(L.q, xn, T, qkv, width);
  }
  if (own_kv) {
    linear(L.k, xn, T, qkv + q_dim, width);
    // Keys equal values: V from the raw keys (before k_norm and RoPE).
    linear(a.values_from_keys ? L.k : L.v, xn, T, qkv + q_dim + kv_dim, width);
  }
  const Rope& r = rope(a.sliding_window > 0, hd);
  float* q = buf(kQ, T * q_dim);
  float* k = buf(kK, T * kv_dim);
  float* v = buf(kV, T * kv_dim);
  QkvPostProblem qp;
  qp.qkv = qkv;
  qp.bias = or_null(L.qkv_bias);
  qp.q_norm = or_null(L.q_norm);
  qp.k_norm = or_null(L.k_norm);
  qp.norm_eps = eps;
  qp.positions = positions;
  qp.inv_freq = r.inv_freq.data();
  qp.rotary_dim = r.rotary_dim;
  qp.attention_scaling = r.attention_scaling;
  qp.tokens = T;
  qp.heads = a.num_heads;
  qp.kv_heads = a.num_kv_heads;
  qp.head_dim = hd;
  qp.q = q;
  qp.k = k;
  qp.v = v;
  qkv_post(qp, stream);
  if (own_kv && c.v_norm) {
    float* ones = buf(kOnes, hd);
    const std::vector<float> h(size_t(hd), 1.0f);
    TURBOKV_CUDA_CHECK(
        cudaMemcpyAsync(ones, h.data(), h.size() * 4, cudaMemcpyHostToDevice, stream));
    rms_norm(v, T * a.num_kv_heads, hd, ones, eps, v, Elem::kF32, stream);
  }
  float* attn = buf(kAttn, T * q_dim);
  for (const SequenceRows& s : rows) {
    if (auto* wide = dynamic_cast<DeviceWideKVCache*>(s.cache)) {  // heads above 256 dims
      wide->append_device(k + s.row * kv_dim, v + s.row * kv_dim, s.count);
      wide->attend_device(q + s.row * q_dim, s.count, a.num_heads, c.attention_scale,
                          attn + s.row * q_dim);
    } else if (own_kv) {
      DeviceKVCache& cache = device_kv(s.cache, l);
      cache.append_device(k + s.row * kv_dim, v + s.row * kv_dim, s.count);
      attend(cache, q + s.row * q_dim, s.count, a.num_heads, a.sliding_window,
             attn + s.row * q_dim);
    } else {
      const auto* shared = dynamic_cast<const SharedKVCache*>(s.cache);
      if (shared == nullptr) {
        throw InvalidArgument(str_cat("layer ", l,
                                      ": a KV-shared layer needs a shared view (got a ",
                                      s.cache->type_name(), " cache)"));
      }
      if (const auto* wide = dynamic_cast<const DeviceWideKVCache*>(&shared->owner())) {
        wide->attend_device(q + s.row * q_dim, s.count, a.num_heads, c.attention_scale,
                            attn + s.row * q_dim);
        continue;
      }
      const auto* owner = dynamic_cast<const DeviceKVCache*>(&shared->owner());
      if (owner == nullptr) throw InvalidArgument(str_cat("layer ", l, ": owner not on the GPU"));
      attend(*owner, q + s.row * q_dim, s.count, a.num_heads, a.sliding_window,
             attn + s.row * q_dim);
    }
  }
  if (gate != nullptr) sigmoid_gate(attn, gate, T * q_dim, stream);
  linear(L.o, attn, T, out, c.hidden_size);
}

void HybridForward::Impl::linear_attention_layer(int l, const std::vector<SequenceRows>& rows,
                                                 const float* xn, int64_t T, float* out) {
  const Layer& L = layers[size_t(l)];
  const LinearAttentionConfig& la = c.linear;
  const GatedDeltaDims dims{la.num_key_heads, la.num_value_heads, la.key_head_dim,
                            la.value_head_dim};
  const int64_t C = la.conv_channels(), Hv = la.num_value_heads;
  const int64_t key_dim = int64_t(la.num_key_heads) * la.key_head_dim;
  const int64_t v_dim = Hv * la.value_head_dim;
  float* mixed = buf(kMixed, T * C);
  float* conv = buf(kConv, T * C);
  float* z = buf(kZ, T * v_dim);
  float* core = buf(kCore, T * v_dim);
  float* b = buf(kB, T * Hv);
  float* a = buf(kA, T * Hv);
  linear(L.la_qkv, xn, T, mixed, C);
  linear(L.la_z, xn, T, z, v_dim);
  linear(L.la_b, xn, T, b, Hv);
  linear(L.la_a, xn, T, a, Hv);
  std::vector<DeviceRecurrentState*> states;
  for (const SequenceRows& s : rows) {
    auto* state = dynamic_cast<DeviceRecurrentState*>(s.cache);
    if (state == nullptr || state->shape().conv_channels != C || state->shape().heads != Hv) {
      throw InvalidArgument(str_cat("layer ", l,
                                    ": a linear-attention layer needs its GPU "
                                    "recurrent state of ",
                                    Hv, " heads, got a ", s.cache->type_name(), " cache"));
    }
    causal_conv1d_silu(mixed + s.row * C, s.count, int(C), la.conv_kernel, L.conv.data(),
                       state->conv(), conv + s.row * C, stream);
    states.push_back(state);
  }
  gated_delta_prepare(conv, a, b, T, dims, L.a_log.data(), L.dt_bias.data(), stream);
  for (size_t i = 0; i < rows.size(); ++i) {
    const SequenceRows& s = rows[i];
    const float* base = conv + s.row * C;
    GatedDeltaRows in;
    in.q = base;
    in.k = base + key_dim;
    in.v = base + 2 * key_dim;
    in.qk_stride = C;
    in.v_stride = C;
    in.g = a + s.row * Hv;
    in.beta = b + s.row * Hv;
    in.T = s.count;
    // The recurrence for prefill too: on an H200 it is 6-9x faster than the chunked kernel
    // at the Qwen3.5-4B shape (bench/cuda/delta_rule_bench, docs/benchmarks.md).
    gated_delta_recurrent(in, dims, states[i]->state(), core + s.row * v_dim, stream);
    states[i]->advance(s.count);
  }
  gated_rms_norm(core, z, T * Hv, la.value_head_dim, L.la_norm.data(), float(c.rms_norm_eps),
                 stream);
  linear(L.la_out, core, T, out, c.hidden_size);
}

void HybridForward::Impl::mla_layer(int l, const std::vector<SequenceRows>& rows, const float* xn,
                                    int64_t T, const int32_t* positions, float* out) {
  const Layer& L = layers[size_t(l)];
  const MlaConfig& m = c.mla;
  const int64_t heads = c.num_heads, nope = m.qk_nope_head_dim, rope_dim = m.qk_rope_head_dim;
  const int64_t qk = nope + rope_dim, r = m.kv_lora_rank, Ld = m.latent_dim(), vd = m.v_head_dim;
  const float eps = float(c.rms_norm_eps);
  float* q = buf(kQ, T * heads * qk);  // [T, heads, nope | rope]
  if (m.q_lora_rank > 0) {
    float* qa = buf(kTmp, T * m.q_lora_rank);
    linear(L.q_a, xn, T, qa, m.q_lora_rank);
    rms_norm(qa, T, m.q_lora_rank, L.q_a_norm.data(), eps, qa, Elem::kF32, stream);
    linear(L.q_b, qa, T, q, heads * qk);
  } else {
    linear(L.q, xn, T, q, heads * qk);
  }
  float* latent = buf(kLatent, T * Ld);  // [T, r | rope]: the cached rows
  linear(L.kv_a, xn, T, latent, Ld);
  float* c_part = buf(kTmp2, T * r);
  copy_cols(latent, Ld, c_part, r, T, r, stream);
  rms_norm(c_part, T, r, L.kv_a_norm.data(), eps, c_part, Elem::kF32, stream);
  copy_cols(c_part, r, latent, Ld, T, r, stream);
  // RoPE of the query heads' and the shared key's rotary parts through qkv_post: rows of
  // [heads x rope | key rope | (unused) value rope].
  const int64_t width = (heads + 2) * rope_dim;
  float* rope_in = buf(kRopeIn, T * width);
  TURBOKV_CUDA_CHECK(cudaMemsetAsync(rope_in, 0, size_t(T * width) * 4, stream));
  for (int64_t h = 0; h < heads; ++h) {
    copy_cols(q + h * qk + nope, heads * qk, rope_in + h * rope_dim, width, T, rope_dim, stream);
  }
  copy_cols(latent + r, Ld, rope_in + heads * rope_dim, width, T, rope_dim, stream);
  if (m.rope_interleave)
    deinterleave_pairs(rope_in, T * (heads + 2), rope_dim, int(rope_dim), stream);
  const Rope& rp = rope(false, int(rope_dim));
  float* q_rope = buf(kQg, T * heads * rope_dim);
  float* k_rope = buf(kK, T * rope_dim);
  float* v_unused = buf(kV, T * rope_dim);
  QkvPostProblem qp;
  qp.qkv = rope_in;
  qp.norm_eps = eps;
  qp.positions = positions;
  qp.inv_freq = rp.inv_freq.data();
  qp.rotary_dim = rp.rotary_dim;
  qp.attention_scaling = rp.attention_scaling;
  qp.tokens = T;
  qp.heads = int(heads);
  qp.kv_heads = 1;
  qp.head_dim = int(rope_dim);
  qp.q = q_rope;
  qp.k = k_rope;
  qp.v = v_unused;
  qkv_post(qp, stream);
  copy_cols(k_rope, rope_dim, latent + r, Ld, T, rope_dim, stream);
  // Latent queries: per head [W_uk,hᵀ q_nope,h | q_rope,h].
  float* ql = buf(kQl, T * heads * Ld);
  float* part = buf(kTmp, T * std::max(nope, r));
  for (int64_t h = 0; h < heads; ++h) {
    copy_cols(q + h * qk, heads * qk, part, nope, T, nope, stream);
    linear(L.absorb[size_t(h)], part, T, ql + h * Ld, heads * Ld);
    copy_cols(q_rope + h * rope_dim, heads * rope_dim, ql + h * Ld + r, heads * Ld, T, rope_dim,
              stream);
  }
  float* att = buf(kAtt, T * heads * Ld);
  for (const SequenceRows& s : rows) {
    if (auto* wide = dynamic_cast<DeviceLatentCache*>(s.cache)) {  // rows above 256 dims
      wide->append_device(latent + s.row * Ld, s.count);
      wide->attend_device(ql + s.row * heads * Ld, s.count, int(heads), c.attention_scale,
                          att + s.row * heads * Ld);
      continue;
    }
    DeviceKVCache& cache = device_kv(s.cache, l);
    cache.append_device(latent + s.row * Ld, latent + s.row * Ld, s.count);
    attend(cache, ql + s.row * heads * Ld, s.count, int(heads), 0, att + s.row * heads * Ld);
  }
  float* ov = buf(kOv, T * heads * vd);
  for (int64_t h = 0; h < heads; ++h) {
    copy_cols(att + h * Ld, heads * Ld, part, r, T, r, stream);
    linear(L.expand[size_t(h)], part, T, ov + h * vd, heads * vd);
  }
  linear(L.o, ov, T, out, c.hidden_size);
}

void HybridForward::Impl::mlp(const Mlp& w, const float* xn, int64_t T, float* out, int act_slot,
                              int gu_slot) {
  float* gu = buf(gu_slot, T * 2 * w.inter);
  linear(w.gate_up, xn, T, gu, 2 * w.inter);
  float* act = buf(act_slot, T * w.inter);
  gated_activation(gu, T, w.inter, or_null(w.gate_bias), or_null(w.up_bias), c.activation, act,
                   Elem::kF32, stream);
  linear(w.down, act, T, out, c.hidden_size);
  if (w.down_bias.size() > 0) {
    // out += bias, through the residual kernel's bias (x += 0 + bias).
    float* zeros = buf(kTmp2, T * c.hidden_size);
    TURBOKV_CUDA_CHECK(cudaMemsetAsync(zeros, 0, size_t(T * c.hidden_size) * 4, stream));
    residual_add(out, zeros, T, c.hidden_size, w.down_bias.data(), nullptr, 0, stream);
  }
}

void HybridForward::Impl::moe(const Layer& L, const float* xn, int64_t T, float* out) {
  const int64_t H = c.hidden_size;
  const MoeWeights& host_moe = *host.layers()[size_t(&L - layers.data())].moe;
  const int E = int(L.experts.size()), K = host_moe.top_k;
  float* logits = buf(kRouter, T * E);
  linear(L.router, xn, T, logits, E);
  std::vector<float> h_logits(size_t(T * E));
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(h_logits.data(), logits, h_logits.size() * 4,
                                     cudaMemcpyDeviceToHost, stream));
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  // The CPU's routing (softmax top-k or sigmoid group-limited top-k), token by token.
  std::vector<int> ids(size_t(T * K));
  std::vector<float> weights(ids.size());
  for (int64_t t = 0; t < T; ++t) {
    turbokv::moe_route(host_moe, h_logits.data() + t * E, ids.data() + t * K,
                       weights.data() + t * K);
  }
  std::vector<int32_t> rows_of;
  std::vector<float> weight_of;
  std::vector<std::pair<int64_t, int64_t>> range(size_t(E), {0, 0});
  for (int e = 0; e < E; ++e) {
    range[size_t(e)].first = int64_t(rows_of.size());
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < K; ++j) {
        if (ids[size_t(t * K + j)] == e) {
          rows_of.push_back(int32_t(t));
          weight_of.push_back(weights[size_t(t * K + j)]);
        }
      }
    }
    range[size_t(e)].second = int64_t(rows_of.size()) - range[size_t(e)].first;
  }
  const int32_t* d_rows_of = put(d_rows, rows_of);
  DeviceBuffer<float> d_weights = DeviceBuffer<float>::upload(weight_of);
  TURBOKV_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(T * H) * 4, stream));
  for (int e = 0; e < E; ++e) {
    const auto [begin, count] = range[size_t(e)];
    if (count == 0) continue;
    float* ex = buf(kExpertX, count * H);
    gather_rows(xn, H, d_rows_of + begin, count, ex, stream);
    float* ey = buf(kExpertOut, count * H);
    mlp(L.experts[size_t(e)], ex, count, ey, kExpertAct, kExpertGateUp);
    scatter_add_weighted(out, ey, d_rows_of + begin, d_weights.data() + begin, count, H, stream);
  }
  if (L.shared_expert) {
    float* sh = buf(kMlpOut, T * H);
    mlp(L.shared, xn, T, sh, kAct, kGateUp);
    if (L.shared_gate.rows > 0) {
      float* g = buf(kTmp, T);
      linear(L.shared_gate, xn, T, g, 1);
      add_sigmoid_gated_rows(out, sh, g, T, H, stream);
    } else {
      residual_add(out, sh, T, H, nullptr, nullptr, 0, stream);
    }
  }
  // d_weights is freed at return: its last readers must be done.
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void HybridForward::Impl::run_step(const std::vector<ChunkSlice>& slices) {
  cudaStream_t s = stream;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float eps = float(c.rms_norm_eps);
  std::vector<int32_t> tokens, positions;
  std::vector<SequenceRows> rows_template;
  for (const ChunkSlice& sl : slices) {
    const int64_t first = (*sl.chunk->caches)[0]->size();
    rows_template.push_back(SequenceRows{nullptr, int64_t(tokens.size()), sl.count});
    for (int i = 0; i < sl.count; ++i) {
      tokens.push_back(sl.chunk->tokens[sl.begin + i]);
      positions.push_back(int32_t(first + i));
    }
  }
  const int64_t T = int64_t(tokens.size());
  if (T > max_tokens) throw Error("CUDA forward: a step larger than its buffers");
  const int32_t* dt = put(d_tokens, tokens);
  const int32_t* dp = put(d_positions, positions);
  float* x = buf(kX, T * H);
  embed_rows(embed.ptr(), embed.elem, H, dt, T, host.embedding_scale(), x, s);

  // gemma4 per-layer inputs [T, layers, P]: (rmsnorm(x·Wᵀ / sqrt(H)) + embed_pl(token) sqrt(P))
  // / sqrt(2).
  const int64_t P = c.per_layer_input_dim, LP = int64_t(c.num_layers) * P;
  float* pli = nullptr;
  if (P > 0) {
    pli = buf(kPli, T * LP);
    linear(per_layer_model_projection, x, T, pli, LP);
    scale(pli, T * LP,
          round_to(float(1.0 / std::sqrt(double(H))), host.per_layer_model_projection().dtype), s);
    rms_norm(pli, T * c.num_layers, P, per_layer_projection_norm.data(), eps, pli, Elem::kF32, s);
    std::vector<int32_t> ids = tokens;
    for (int32_t& id : ids) {
      if (id >= c.per_layer_vocab) id = 0;
    }
    const int32_t* di = put(d_pli_ids, ids);
    float* tok = buf(kPliTok, T * LP);
    embed_rows(per_layer_embed.ptr(), per_layer_embed.elem, LP, di, T,
               round_to(float(std::sqrt(double(P))), host.per_layer_embedding().dtype), tok, s);
    add_scale(pli, tok, T * LP, float(1.0 / std::sqrt(2.0)), s);
  }

  float* xn = buf(kNorm, T * H);
  float* out = buf(kOut, T * H);
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers[size_t(l)];
    std::vector<SequenceRows> rows = rows_template;
    for (size_t i = 0; i < slices.size(); ++i) {
      rows[i].cache = (*slices[i].chunk->caches)[size_t(l)].get();
    }
    rms_norm(x, T, H, L.input_norm.data(), eps, xn, Elem::kF32, s);
    switch (c.layer_kind[size_t(l)]) {
      case LayerKind::kAttention:
        attention_layer(l, rows, xn, T, dp, out);
        break;
      case LayerKind::kLinearAttention:
        linear_attention_layer(l, rows, xn, T, out);
        break;
      case LayerKind::kMla:
        mla_layer(l, rows, xn, T, dp, out);
        break;
    }
    residual_add(x, out, T, H, or_null(L.o_bias),
                 c.sandwich_norms ? L.post_attention_norm.data() : nullptr, eps, s);
    rms_norm(x, T, H, (c.sandwich_norms ? L.pre_feedforward_norm : L.post_attention_norm).data(),
             eps, xn, Elem::kF32, s);
    if (L.moe) {
      moe(L, xn, T, out);
    } else {
      mlp(L.mlp, xn, T, out, kAct, kGateUp);
    }
    residual_add(x, out, T, H, nullptr, c.sandwich_norms ? L.post_feedforward_norm.data() : nullptr,
                 eps, s);
    if (P > 0) {
      // act(x·W_gateᵀ) * input through the gated kernel: rows of [gate | input].
      float* gi = buf(kPliGate, T * 2 * P);
      linear(L.per_layer_gate, x, T, gi, 2 * P);
      copy_cols(pli + l * P, LP, gi + P, 2 * P, T, P, s);
      float* act = buf(kPliAct, T * P);
      gated_activation(gi, T, P, nullptr, nullptr, c.activation, act, Elem::kF32, s);
      float* branch = buf(kBranch, T * H);
      linear(L.per_layer_projection, act, T, branch, H);
      residual_add(x, branch, T, H, nullptr, L.per_layer_norm.data(), eps, s);
    }
    if (c.layer_scalar) scale(x, T * H, L.layer_scalar, s);
  }

  // Logits of the rows that need them (as DecoderModel::write_logits).
  std::vector<int32_t> rows;
  std::vector<float*> destinations;
  int64_t offset = 0;
  for (const ChunkSlice& sl : slices) {
    const Model::Chunk& chunk = *sl.chunk;
    if (chunk.logits != nullptr && chunk.all_logits) {
      for (int i = 0; i < sl.count; ++i) {
        rows.push_back(int32_t(offset + i));
        destinations.push_back(chunk.logits + int64_t(sl.begin + i) * V);
      }
    } else if (chunk.logits != nullptr && sl.begin + sl.count == chunk.n_tokens) {
      rows.push_back(int32_t(offset + sl.count - 1));
      destinations.push_back(chunk.logits);
    }
    offset += sl.count;
  }
  const int32_t* d_logit_rows = put(d_rows, rows);
  host_logits.resize(size_t(kLogitRows * V));
  for (size_t b = 0; b < rows.size(); b += size_t(kLogitRows)) {
    const int64_t n = std::min<int64_t>(kLogitRows, int64_t(rows.size() - b));
    gather_rows(x, H, d_logit_rows + b, n, out, s);
    rms_norm(out, n, H, final_norm.data(), eps, xn, Elem::kF32, s);
    float* logits = buf(kLogits, n * V);
    linear(*lm_head, xn, n, logits, V);
    if (c.final_logit_softcap > 0) softcap(logits, n * V, c.final_logit_softcap, s);
    TURBOKV_CUDA_CHECK(
        cudaMemcpyAsync(host_logits.data(), logits, size_t(n * V) * 4, cudaMemcpyDeviceToHost, s));
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(destinations[b + size_t(i)], host_logits.data() + i * V, size_t(V) * 4);
    }
  }
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));
}

HybridForward::HybridForward(const DecoderModel& host, cudaStream_t stream, const Gemm& gemm,
                             int max_step_tokens)
    : impl_(std::make_unique<Impl>(host, stream, gemm, max_step_tokens)) {
  const ModelConfig& c = host.config();
  if (const std::string why = hybrid_unsupported_reason(c); !why.empty()) {
    throw Unsupported(str_cat("--device cuda: ", why, " do not run on the GPU yet"));
  }
  // Weights: check they fit before the first allocation.
  int64_t need = host.embedding().total_bytes();
  if (!c.tie_word_embeddings) need += host.lm_head().total_bytes();
  if (c.per_layer_input_dim > 0) {
    need +=
        host.per_layer_embedding().total_bytes() + host.per_layer_model_projection().total_bytes();
  }
  auto mlp_bytes = [](const MlpWeights& m) {
    return m.gate.total_bytes() + m.up.total_bytes() + m.down.total_bytes();
  };
  for (const LayerWeights& W : host.layers()) {
    need += W.q.total_bytes() + W.k.total_bytes() + W.v.total_bytes() + W.o.total_bytes();
    need += W.linear.qkv.total_bytes() + W.linear.z.total_bytes() + W.linear.out.total_bytes();
    if (W.mla) {
      need += W.mla->q.total_bytes() + W.mla->q_a.total_bytes() + W.mla->q_b.total_bytes() +
              W.mla->kv_a.total_bytes() + W.mla->o.total_bytes();
      for (const WeightMatrix& m : W.mla->absorb) need += m.total_bytes();
      for (const WeightMatrix& m : W.mla->expand) need += m.total_bytes();
    }
    if (W.moe) {
      need += W.moe->router.total_bytes();
      for (const MlpWeights& e : W.moe->experts) need += mlp_bytes(e);
      if (W.moe->shared_expert) need += mlp_bytes(*W.moe->shared_expert);
    } else {
      need += mlp_bytes(W.mlp);
    }
  }
  size_t free_bytes = 0, total_bytes = 0;
  TURBOKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (size_t(need) > free_bytes) {
    throw Error(str_cat("--device cuda: the model's weights need ", size_t(need) >> 20,
                        " MiB of GPU memory, the GPU has ", free_bytes >> 20, " of ",
                        total_bytes >> 20, " MiB free"));
  }
  impl_->upload_weights();
}

HybridForward::~HybridForward() = default;

size_t HybridForward::weight_bytes() const {
  return impl_->weight_bytes;
}

LayerCaches HybridForward::make_caches(DeviceCacheContext& context,
                                       const std::vector<LayerCachePlan>& plan,
                                       DenseElem dense_elem, bool fused) {
  LayerCaches caches;
  caches.reserve(plan.size());
  for (const LayerCachePlan& p : plan) {
    if (p.kind == LayerCacheKind::kRecurrent) {
      caches.push_back(std::make_unique<DeviceRecurrentState>(p.recurrent, context));
    } else if (p.kind == LayerCacheKind::kShared) {
      if (p.shared_with < 0 || size_t(p.shared_with) >= caches.size()) {
        throw InvalidArgument(
            str_cat("a shared layer's owner ", p.shared_with, " must come before it in the plan"));
      }
      caches.push_back(
          std::make_unique<SharedKVCache>(caches[size_t(p.shared_with)].get(), p.shared_with));
    } else if (p.layer == LayerStateKind::kAttention && p.head_dim > 256) {
      // Heads wider than the paged formats: dense contiguous keys and values, which no GPU codec
      // takes; a quantized plan for such a layer is refused.
      if (p.kind != LayerCacheKind::kDense && p.kind != LayerCacheKind::kRotating) {
        throw Unsupported(str_cat("--device cuda: ", layer_cache_kind_name(p.kind),
                                  " caches of attention heads of ", p.head_dim,
                                  " dims (the GPU's codecs take up to 256); use --device cpu, "
                                  "or no --kv-bits for a dense cache"));
      }
      caches.push_back(std::make_unique<DeviceWideKVCache>(
          p.kv_heads, p.head_dim, dense_elem, p.kind == LayerCacheKind::kRotating ? p.window : 0,
          context.stream()));
    } else if (p.layer == LayerStateKind::kLatent && p.head_dim > 256) {
      // Wider than the paged formats: one contiguous buffer of rows (device_latent_cache.h).
      caches.push_back(
          std::make_unique<DeviceLatentCache>(p.head_dim, dense_elem, context.stream()));
    } else {
      LayerCaches one = make_device_layer_caches(context, {p}, dense_elem, fused);
      caches.push_back(std::move(one.front()));
    }
  }
  return caches;
}

void HybridForward::forward(std::span<const Model::Chunk> chunks) {
  for (const std::vector<ChunkSlice>& step : split_into_steps(chunks, kForwardStepTokens)) {
    impl_->run_step(step);
  }
}

}  // namespace turbokv::cuda
