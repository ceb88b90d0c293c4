// CudaDecoderModel (cuda_decoder.h): weight upload, step buffers, and the forward pass.
#include "model/cuda/cuda_decoder.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/model_ops.h"
#include "model/rope_scaling.h"

namespace turbokv::cuda {
namespace {

// Rows of logits per lm_head GEMM (as the CPU forward): bounds the logits buffer.
constexpr int64_t kLogitRows = 64;

Elem elem_of(DType d) {
  switch (d) {
    case DType::F32: return Elem::kF32;
    case DType::F16: return Elem::kF16;
    case DType::BF16: return Elem::kBF16;
    default: break;
  }
  throw Unsupported(str_cat("--device cuda: weights of dtype ", dtype_name(d),
                            " have no GPU path (F32, F16, BF16 are supported)"));
}

// A weight matrix on the GPU in its stored element type: [rows, cols].
struct DeviceMatrix {
  DeviceBuffer<uint8_t> data;
  Elem elem = Elem::kF32;
  int64_t rows = 0, cols = 0;
  const void* ptr() const { return data.data(); }
};

// Uploads the row-wise concatenation of parts (same cols and dtype; e.g. q, k, v).
DeviceMatrix upload_rows(std::initializer_list<const WeightMatrix*> parts, size_t* total) {
  DeviceMatrix m;
  const WeightMatrix& first = **parts.begin();
  m.elem = elem_of(first.dtype);
  m.cols = first.cols;
  for (const WeightMatrix* p : parts) {
    if (p->cols != m.cols || p->dtype != first.dtype) {
      throw Unsupported("--device cuda: fused projections need one dtype and width");
    }
    m.rows += p->rows;
  }
  const size_t row_bytes = size_t(m.cols) * elem_bytes(m.elem);
  m.data = DeviceBuffer<uint8_t>(size_t(m.rows) * row_bytes);
  size_t offset = 0;
  for (const WeightMatrix* p : parts) {
    TURBOKV_CUDA_CHECK(cudaMemcpy(m.data.data() + offset, p->data, size_t(p->rows) * row_bytes,
                                  cudaMemcpyHostToDevice));
    offset += size_t(p->rows) * row_bytes;
  }
  *total += m.data.bytes();
  return m;
}

DeviceBuffer<float> upload_vector(const std::vector<float>& v, size_t* total) {
  *total += v.size() * sizeof(float);
  return DeviceBuffer<float>::upload(v);
}

// The concatenation of bias parts (zeros for missing ones); empty when no part has one.
std::vector<float> concat_bias(std::initializer_list<std::pair<const std::vector<float>*, int64_t>>
                                   parts) {
  bool any = false;
  for (const auto& [b, n] : parts) any |= !b->empty();
  std::vector<float> out;
  if (!any) return out;
  for (const auto& [b, n] : parts) {
    if (b->empty()) {
      out.insert(out.end(), size_t(n), 0.0f);
    } else {
      out.insert(out.end(), b->begin(), b->end());
    }
  }
  return out;
}

const float* or_null(const DeviceBuffer<float>& b) { return b.size() > 0 ? b.data() : nullptr; }

struct DeviceMlp {
  DeviceMatrix gate_up, down;  // [2I, H] (gate rows, then up rows), [H, I]
  DeviceBuffer<float> gate_bias, up_bias, down_bias;
  int64_t inter = 0;
};

DeviceMlp upload_mlp(const MlpWeights& w, size_t* total) {
  DeviceMlp m;
  m.gate_up = upload_rows({&w.gate, &w.up}, total);
  m.down = upload_rows({&w.down}, total);
  m.gate_bias = upload_vector(w.gate_bias, total);
  m.up_bias = upload_vector(w.up_bias, total);
  m.down_bias = upload_vector(w.down_bias, total);
  m.inter = w.gate.rows;
  return m;
}

struct DeviceLayer {
  DeviceBuffer<float> input_norm, post_attention_norm, pre_feedforward_norm,
      post_feedforward_norm, q_norm, k_norm;
  DeviceMatrix qkv, o;
  DeviceBuffer<float> qkv_bias, o_bias;
  DeviceMlp mlp;
  bool moe = false;
  DeviceMatrix router;
  std::vector<DeviceMlp> experts;
  int top_k = 0;
  bool norm_topk = false;
};

// A growable pair of pinned host and device buffers for the small per-step arrays (tokens,
// positions, block tables, lengths): each array is written to the host side and copied to the
// same offset on the device, in stream order; offsets are never reused before the stream has
// been synchronized (reset()).
class Staging {
 public:
  ~Staging() {
    if (host_ != nullptr) cudaFreeHost(host_);
    if (device_ != nullptr) cudaFree(device_);
  }
  template <typename T>
  T* put(const T* data, size_t count, cudaStream_t stream) {
    const size_t bytes = count * sizeof(T);
    const size_t at = (used_ + 15) / 16 * 16;
    if (at + bytes > capacity_) grow(std::max(2 * capacity_, at + bytes + (1 << 20)), stream);
    const size_t offset = (used_ + 15) / 16 * 16;
    std::memcpy(host_ + offset, data, bytes);
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(device_ + offset, host_ + offset, bytes,
                                       cudaMemcpyHostToDevice, stream));
    used_ = offset + bytes;
    return reinterpret_cast<T*>(device_ + offset);
  }
  void reset() { used_ = 0; }

 private:
  // Everything queued so far may still read the old buffers: wait for it first.
  void grow(size_t bytes, cudaStream_t stream) {
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (host_ != nullptr) TURBOKV_CUDA_CHECK(cudaFreeHost(host_));
    if (device_ != nullptr) TURBOKV_CUDA_CHECK(cudaFree(device_));
    TURBOKV_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), bytes, 0));
    TURBOKV_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), bytes));
    capacity_ = bytes;
    used_ = 0;
  }
  uint8_t* host_ = nullptr;
  uint8_t* device_ = nullptr;
  size_t capacity_ = 0, used_ = 0;
};

// A device scratch buffer that only grows; zeroed ones stay all-zero between calls (the fused
// attention kernels leave their workspace so).
class Workspace {
 public:
  Workspace(bool zeroed) : zeroed_(zeroed) {}
  void* get(size_t bytes, cudaStream_t stream) {
    if (bytes > buffer_.size()) {
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
      buffer_ = DeviceBuffer<uint8_t>(std::max(bytes, 2 * buffer_.size()));
      if (zeroed_) buffer_.zero();
    }
    return buffer_.data();
  }

 private:
  bool zeroed_;
  DeviceBuffer<uint8_t> buffer_;
};

struct Rope {
  RopeConfig config;
  DeviceBuffer<float> inv_freq;
  float attention_scaling = 1;
  int rotary_dim = 0;
  bool dynamic = false;
  int64_t uploaded_for = -1;  // seq_len the buffer was computed for (dynamic only)
};

}  // namespace

struct CudaDecoderModel::Impl {
  cudaStream_t stream = nullptr;
  std::unique_ptr<Gemm> gemm;
  DeviceMatrix embed, lm_head_own;
  const DeviceMatrix* lm_head = nullptr;
  DeviceBuffer<float> final_norm;
  std::vector<DeviceLayer> layers;
  Rope rope_global, rope_local;
  bool has_local = false;

  // Step buffers for up to T = max_step_tokens tokens.
  int64_t max_tokens = 0;
  DeviceBuffer<float> x, norm32, qkv, q, k, v, attn, out, gate_up, mlp_out, logits;
  DeviceBuffer<uint8_t> narrow;  // GEMM inputs in the weights' element type
  DeviceBuffer<float> router_logits, moe_out, expert_x, expert_gate_up, expert_out;
  DeviceBuffer<uint8_t> expert_narrow;
  DeviceBuffer<int32_t> expert_ids, expert_rows;
  DeviceBuffer<float> expert_weights;
  std::vector<float> host_logits;  // pinned would be faster; [kLogitRows, vocab]
  mutable Staging staging;
  mutable Workspace zeroed_ws{true}, plain_ws{false};

  ~Impl() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

CudaDecoderModel::CudaDecoderModel(std::unique_ptr<DecoderModel> host,
                                   const CudaModelOptions& options)
    : host_(std::move(host)), impl_(std::make_unique<Impl>()) {
  if (!device_available()) {
    throw Unsupported("--device cuda: no CUDA device is available on this machine");
  }
  const ModelConfig& c = host_->config();
  Impl& m = *impl_;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  m.gemm = std::make_unique<Gemm>(m.stream);

  // Weights: check they fit before the first allocation.
  size_t need = 0;
  auto matrix_bytes = [](const WeightMatrix& w) {
    return size_t(w.rows) * size_t(w.cols) * (w.dtype == DType::F32 ? 4 : 2);
  };
  need += matrix_bytes(host_->embedding());
  if (!c.tie_word_embeddings) need += matrix_bytes(host_->lm_head());
  for (const LayerWeights& L : host_->layers()) {
    need += matrix_bytes(L.q) + matrix_bytes(L.k) + matrix_bytes(L.v) + matrix_bytes(L.o);
    if (L.moe) {
      need += matrix_bytes(L.moe->router);
      for (const MlpWeights& e : L.moe->experts) {
        need += matrix_bytes(e.gate) + matrix_bytes(e.up) + matrix_bytes(e.down);
      }
    } else {
      need += matrix_bytes(L.mlp.gate) + matrix_bytes(L.mlp.up) + matrix_bytes(L.mlp.down);
    }
  }
  size_t free_bytes = 0, total_bytes = 0;
  TURBOKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (need > free_bytes) {
    throw Error(str_cat("--device cuda: the model's weights need ", need >> 20, " MiB of GPU "
                        "memory, the GPU has ", free_bytes >> 20, " of ", total_bytes >> 20,
                        " MiB free"));
  }

  size_t& total = weight_bytes_;
  m.embed = upload_rows({&host_->embedding()}, &total);
  if (c.tie_word_embeddings) {
    m.lm_head = &m.embed;
  } else {
    m.lm_head_own = upload_rows({&host_->lm_head()}, &total);
    m.lm_head = &m.lm_head_own;
  }
  m.final_norm = upload_vector(host_->final_norm(), &total);
  const int64_t q_dim = int64_t(c.num_heads) * c.head_dim;
  const int64_t kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
  for (const LayerWeights& L : host_->layers()) {
    DeviceLayer d;
    d.input_norm = upload_vector(L.input_norm, &total);
    d.post_attention_norm = upload_vector(L.post_attention_norm, &total);
    d.pre_feedforward_norm = upload_vector(L.pre_feedforward_norm, &total);
    d.post_feedforward_norm = upload_vector(L.post_feedforward_norm, &total);
    d.q_norm = upload_vector(L.q_norm, &total);
    d.k_norm = upload_vector(L.k_norm, &total);
    d.qkv = upload_rows({&L.q, &L.k, &L.v}, &total);
    d.qkv_bias =
        upload_vector(concat_bias({{&L.q_bias, q_dim}, {&L.k_bias, kv_dim}, {&L.v_bias, kv_dim}}),
                      &total);
    d.o = upload_rows({&L.o}, &total);
    d.o_bias = upload_vector(L.o_bias, &total);
    if (L.moe) {
      d.moe = true;
      d.router = upload_rows({&L.moe->router}, &total);
      for (const MlpWeights& e : L.moe->experts) d.experts.push_back(upload_mlp(e, &total));
      d.top_k = L.moe->top_k;
      d.norm_topk = L.moe->norm_topk_prob;
    } else {
      d.mlp = upload_mlp(L.mlp, &total);
    }
    m.layers.push_back(std::move(d));
  }

  // RoPE: inverse frequencies per attention type (dynamic NTK: recomputed per step).
  auto init_rope = [&](Rope& r, const RopeConfig& config) {
    r.config = config;
    r.dynamic = config.type == "dynamic";
    const RopeTable t = make_rope_table(config, c.head_dim, 1);
    r.inv_freq = DeviceBuffer<float>::upload(t.inv_freq);
    r.attention_scaling = t.attention_scaling;
    r.rotary_dim = t.rotary_dim();
    r.uploaded_for = 1;
  };
  init_rope(m.rope_global, c.rope);
  if (c.rope_local) {
    init_rope(m.rope_local, *c.rope_local);
    m.has_local = true;
  }

  // Step buffers.
  const int64_t T = options.max_step_tokens;
  m.max_tokens = T;
  const int64_t H = c.hidden_size;
  int64_t inter = c.intermediate_size, moe_inter = c.moe_intermediate_size;
  const int64_t widest = std::max({H, q_dim, inter, moe_inter});
  m.x = DeviceBuffer<float>(size_t(T * H));
  m.norm32 = DeviceBuffer<float>(size_t(T * H));
  m.qkv = DeviceBuffer<float>(size_t(T * (q_dim + 2 * kv_dim)));
  m.q = DeviceBuffer<float>(size_t(T * q_dim));
  m.k = DeviceBuffer<float>(size_t(T * kv_dim));
  m.v = DeviceBuffer<float>(size_t(T * kv_dim));
  m.attn = DeviceBuffer<float>(size_t(T * q_dim));
  m.out = DeviceBuffer<float>(size_t(T * H));
  m.gate_up = DeviceBuffer<float>(size_t(T * 2 * std::max<int64_t>(inter, 1)));
  m.mlp_out = DeviceBuffer<float>(size_t(T * H));
  m.narrow = DeviceBuffer<uint8_t>(size_t(T * widest) * 4);
  m.logits = DeviceBuffer<float>(size_t(kLogitRows) * c.vocab_size);
  m.host_logits.resize(size_t(kLogitRows) * c.vocab_size);
  if (c.num_experts > 0) {
    const int64_t routed = T * c.num_experts_per_token;
    m.router_logits = DeviceBuffer<float>(size_t(T * c.num_experts));
    m.moe_out = DeviceBuffer<float>(size_t(T * H));
    m.expert_x = DeviceBuffer<float>(size_t(T * H));
    m.expert_gate_up = DeviceBuffer<float>(size_t(T * 2 * moe_inter));
    m.expert_out = DeviceBuffer<float>(size_t(T * H));
    m.expert_narrow = DeviceBuffer<uint8_t>(size_t(T * std::max(H, moe_inter)) * 4);
    m.expert_ids = DeviceBuffer<int32_t>(size_t(routed));
    m.expert_weights = DeviceBuffer<float>(size_t(routed));
    m.expert_rows = DeviceBuffer<int32_t>(size_t(routed));
  }

  // The KV pool takes what is left (a fraction of it), or the bytes asked for.
  TURBOKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t reserve = size_t(1) << 30;  // workspaces, cuBLAS, the zero blocks
  size_t pool = options.kv_cache_bytes;
  if (pool == 0) {
    pool = free_bytes > reserve ? size_t(double(free_bytes - reserve) * options.kv_memory_fraction)
                                : 0;
  }
  if (pool < DeviceBlockPool::kChunkBytes || pool + reserve / 2 > free_bytes) {
    throw Error(str_cat("--device cuda: ", pool >> 20, " MiB for the KV cache does not fit next ",
                        "to the model (", free_bytes >> 20, " MiB of GPU memory free after ",
                        weight_bytes_ >> 20, " MiB of weights)"));
  }
  caches_ = std::make_unique<DeviceCacheContext>(pool, m.stream);
}

CudaDecoderModel::~CudaDecoderModel() {
  caches_.reset();  // before the stream goes
}

LayerCaches CudaDecoderModel::make_caches(const ResolvedKV& kv, DenseElem dense_elem) const {
  const bool fused = host_->config().attn_logit_softcap == 0;
  return make_device_layer_caches(*caches_, plan_layer_caches(layer_specs(), kv), dense_elem,
                                  fused);
}

namespace {

// One step's bookkeeping: the slices in execution order and where their rows are.
struct StepSlice {
  ChunkSlice slice;
  int64_t row = 0;    // first row of the slice in the step's buffers
  int64_t first = 0;  // position of its first token
};

DeviceKVCache& device_cache(const Model::Chunk& chunk, int layer) {
  auto* cache = dynamic_cast<DeviceKVCache*>((*chunk.caches)[size_t(layer)].get());
  if (cache == nullptr) {
    throw InvalidArgument(str_cat("layer ", layer, ": the CUDA model needs GPU caches (got a ",
                                  (*chunk.caches)[size_t(layer)]->type_name(), " CPU cache)"));
  }
  return *cache;
}

}  // namespace

void CudaDecoderModel::forward(std::span<const Chunk> chunks) const {
  const ModelConfig& c = host_->config();
  check_chunks(chunks, c.num_layers, c.vocab_size);
  for (const Chunk& chunk : chunks) {
    for (int l = 0; l < c.num_layers; ++l) device_cache(chunk, l);
  }
  Impl& m = *impl_;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_dim = int64_t(c.num_heads) * hd, kv_dim = int64_t(c.num_kv_heads) * hd;
  const float eps = float(c.rms_norm_eps);
  cudaStream_t s = m.stream;

  for (const std::vector<ChunkSlice>& step : split_into_steps(chunks, kForwardStepTokens)) {
    // Execution order: sequences with the same cache formats together (one kernel call per
    // group and layer), single-token slices (decode) first inside a group.
    std::vector<StepSlice> order;
    for (const ChunkSlice& sl : step) {
      order.push_back(StepSlice{sl, 0, (*sl.chunk->caches)[0]->size()});
    }
    std::stable_sort(order.begin(), order.end(), [&](const StepSlice& a, const StepSlice& b) {
      for (int l = 0; l < c.num_layers; ++l) {
        const DeviceFormat* fa = &device_cache(*a.slice.chunk, l).format();
        const DeviceFormat* fb = &device_cache(*b.slice.chunk, l).format();
        if (fa != fb) return fa < fb;
      }
      return (a.slice.count == 1) > (b.slice.count == 1);
    });
    int64_t T = 0;
    std::vector<int32_t> tokens, positions;
    for (StepSlice& o : order) {
      o.row = T;
      T += o.slice.count;
      for (int i = 0; i < o.slice.count; ++i) {
        tokens.push_back(o.slice.chunk->tokens[o.slice.begin + i]);
        positions.push_back(int32_t(o.first + i));
      }
    }
    if (T > m.max_tokens) throw Error("CUDA forward: step larger than its buffers");
    // Every cache gets its blocks for this step before any kernel runs, so a full pool fails
    // the step before it changes anything.
    for (const StepSlice& o : order) {
      for (int l = 0; l < c.num_layers; ++l) {
        device_cache(*o.slice.chunk, l).reserve_tokens(o.slice.count);
      }
    }
    m.staging.reset();
    const int32_t* d_tokens = m.staging.put(tokens.data(), tokens.size(), s);
    const int32_t* d_positions = m.staging.put(positions.data(), positions.size(), s);
    int64_t seq_len = 0;
    for (int32_t p : positions) seq_len = std::max<int64_t>(seq_len, p + 1);
    for (Rope* r : {&m.rope_global, &m.rope_local}) {
      if (r->dynamic && r->uploaded_for != seq_len) {
        const RopeTable t = make_rope_table(r->config, int(hd), seq_len);
        TURBOKV_CUDA_CHECK(cudaMemcpyAsync(r->inv_freq.data(), t.inv_freq.data(),
                                           t.inv_freq.size() * sizeof(float),
                                           cudaMemcpyHostToDevice, s));
        TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));  // the host table goes out of scope
        r->attention_scaling = t.attention_scaling;
        r->uploaded_for = seq_len;
      }
    }

    embed_rows(m.embed.ptr(), m.embed.elem, H, d_tokens, T, host_->embedding_scale(), m.x.data(),
               s);
    for (int l = 0; l < c.num_layers; ++l) {
      const DeviceLayer& L = m.layers[size_t(l)];
      // Attention block.
      rms_norm(m.x.data(), T, H, L.input_norm.data(), eps, m.narrow.data(), L.qkv.elem, s);
      m.gemm->run(m.narrow.data(), L.qkv.ptr(), L.qkv.elem, T, q_dim + 2 * kv_dim, H, m.qkv.data(),
                  q_dim + 2 * kv_dim);
      const int window = c.sliding_window[size_t(l)];
      const Rope& rope = window > 0 && m.has_local ? m.rope_local : m.rope_global;
      QkvPostProblem qp;
      qp.qkv = m.qkv.data();
      qp.bias = or_null(L.qkv_bias);
      qp.q_norm = or_null(L.q_norm);
      qp.k_norm = or_null(L.k_norm);
      qp.norm_eps = eps;
      qp.positions = d_positions;
      qp.inv_freq = rope.inv_freq.data();
      qp.rotary_dim = rope.rotary_dim;
      qp.attention_scaling = rope.attention_scaling;
      qp.tokens = T;
      qp.heads = c.num_heads;
      qp.kv_heads = c.num_kv_heads;
      qp.head_dim = int(hd);
      qp.q = m.q.data();
      qp.k = m.k.data();
      qp.v = m.v.data();
      qkv_post(qp, s);

      AttentionOptions ao;
      ao.n_heads = c.num_heads;
      ao.scale = c.attention_scale;
      ao.logit_softcap = c.attn_logit_softcap;
      ao.sliding_window = window;
      // Runs of consecutive slices whose caches share this layer's format: one append per
      // run, then (formats may change: a staged cache converts once it is long enough) one
      // attention call per run's decode slices and one per longer slice.
      auto runs = [&] {
        std::vector<std::pair<size_t, size_t>> out;
        for (size_t r0 = 0; r0 < order.size();) {
          const DeviceFormat* f = &device_cache(*order[r0].slice.chunk, l).format();
          size_t r1 = r0 + 1;
          while (r1 < order.size() && &device_cache(*order[r1].slice.chunk, l).format() == f) ++r1;
          out.emplace_back(r0, r1);
          r0 = r1;
        }
        return out;
      };
      // The run's block table [n, stride], lengths after this step's append, states.
      struct RunView {
        PagedBatch batch;
        const TQSequenceState* states = nullptr;
        std::vector<int> lens;
      };
      auto upload_run = [&](size_t r0, size_t r1) {
        const int n = int(r1 - r0);
        size_t stride = 1;
        for (size_t i = r0; i < r1; ++i) {
          stride = std::max(stride, device_cache(*order[i].slice.chunk, l).blocks().size());
        }
        std::vector<const uint8_t*> table(static_cast<size_t>(n) * stride);
        std::vector<TQSequenceState> states(static_cast<size_t>(n));
        RunView view;
        view.lens.resize(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
          const StepSlice& o = order[r0 + size_t(i)];
          const DeviceKVCache& cache = device_cache(*o.slice.chunk, l);
          for (size_t b = 0; b < stride; ++b) {
            const uint8_t* block = b < cache.blocks().size() ? cache.blocks()[b] : nullptr;
            table[size_t(i) * stride + b] = block != nullptr ? block : cache.zero_block();
          }
          view.lens[size_t(i)] = int(o.first + o.slice.count);
          states[size_t(i)] = cache.state();
        }
        view.batch.block_table = m.staging.put(table.data(), table.size(), s);
        view.batch.table_stride = int(stride);
        view.batch.seq_len = m.staging.put(view.lens.data(), view.lens.size(), s);
        view.batch.batch = n;
        view.batch.max_len = *std::max_element(view.lens.begin(), view.lens.end());
        view.states = m.staging.put(states.data(), states.size(), s);
        return view;
      };
      std::vector<RunView> views;
      bool converted = false;
      const auto append_runs = runs();
      for (const auto& [r0, r1] : append_runs) {
        for (size_t i = r0; i < r1; ++i) {
          DeviceKVCache& cache = device_cache(*order[i].slice.chunk, l);
          if (cache.needs_calibration()) {
            cache.calibrate(m.k.data() + order[i].row * kv_dim, m.v.data() + order[i].row * kv_dim,
                            order[i].slice.count);
          }
        }
        RunView view = upload_run(r0, r1);
        std::vector<int> row_seq, row_pos;
        for (size_t i = r0; i < r1; ++i) {
          for (int t = 0; t < order[i].slice.count; ++t) {
            row_seq.push_back(int(i - r0));
            row_pos.push_back(int(order[i].first + t));
          }
        }
        const int64_t run_row = order[r0].row;
        AppendRows ar;
        ar.k = m.k.data() + run_row * kv_dim;
        ar.v = m.v.data() + run_row * kv_dim;
        ar.row_seq = m.staging.put(row_seq.data(), row_seq.size(), s);
        ar.row_pos = m.staging.put(row_pos.data(), row_pos.size(), s);
        ar.rows = int(row_seq.size());
        device_cache(*order[r0].slice.chunk, l).format().append(view.batch, view.states, ar, s);
        for (size_t i = r0; i < r1; ++i) {
          DeviceKVCache& cache = device_cache(*order[i].slice.chunk, l);
          const int64_t generation = cache.generation();
          cache.advance(order[i].slice.count);
          converted |= cache.generation() != generation;
        }
        views.push_back(std::move(view));
      }
      const auto attend_runs = converted ? runs() : append_runs;
      for (size_t r = 0; r < attend_runs.size(); ++r) {
        const auto [r0, r1] = attend_runs[r];
        const RunView view = converted ? upload_run(r0, r1) : std::move(views[r]);
        const DeviceFormat& format = device_cache(*order[r0].slice.chunk, l).format();
        const int n = int(r1 - r0);
        for (int i = 0; i < n;) {
          int j = i + 1;
          if (order[r0 + size_t(i)].slice.count == 1) {
            while (j < n && order[r0 + size_t(j)].slice.count == 1) ++j;
          }
          const int sub = j - i;
          const int n_q = order[r0 + size_t(i)].slice.count;
          std::vector<int> starts(static_cast<size_t>(sub) + 1);
          for (int b = 0; b <= sub; ++b) starts[size_t(b)] = b * n_q;
          PagedBatch sb = view.batch;
          sb.block_table = view.batch.block_table + size_t(i) * view.batch.table_stride;
          sb.seq_len = view.batch.seq_len + i;
          sb.batch = sub;
          sb.max_len = *std::max_element(view.lens.begin() + i, view.lens.begin() + j);
          QueryRows qr;
          const int64_t q_row = order[r0 + size_t(i)].row;
          qr.q = m.q.data() + q_row * q_dim;
          qr.out = m.attn.data() + q_row * q_dim;
          qr.q_start = m.staging.put(starts.data(), starts.size(), s);
          qr.max_n_q = n_q;
          const size_t ws_bytes = format.workspace_bytes(sb, qr, ao);
          void* ws = (format.zeroed_workspace() ? m.zeroed_ws : m.plain_ws).get(ws_bytes, s);
          format.attend(sb, view.states + i, qr, ao, n_q, ws, ws_bytes, s);
          i = j;
        }
      }
      const void* attn_in = m.attn.data();
      if (L.o.elem != Elem::kF32) {
        cast(m.attn.data(), T * q_dim, m.narrow.data(), L.o.elem, s);
        attn_in = m.narrow.data();
      }
      m.gemm->run(attn_in, L.o.ptr(), L.o.elem, T, H, q_dim, m.out.data(), H);
      residual_add(m.x.data(), m.out.data(), T, H, or_null(L.o_bias),
                   c.sandwich_norms ? L.post_attention_norm.data() : nullptr, eps, s);

      // Feed-forward block.
      const float* ffn_norm =
          c.sandwich_norms ? L.pre_feedforward_norm.data() : L.post_attention_norm.data();
      const float* post_ffn = c.sandwich_norms ? L.post_feedforward_norm.data() : nullptr;
      if (!L.moe) {
        const DeviceMlp& mlp = L.mlp;
        rms_norm(m.x.data(), T, H, ffn_norm, eps, m.narrow.data(), mlp.gate_up.elem, s);
        m.gemm->run(m.narrow.data(), mlp.gate_up.ptr(), mlp.gate_up.elem, T, 2 * mlp.inter, H,
                    m.gate_up.data(), 2 * mlp.inter);
        gated_activation(m.gate_up.data(), T, mlp.inter, or_null(mlp.gate_bias),
                         or_null(mlp.up_bias), c.activation, m.narrow.data(), mlp.down.elem, s);
        m.gemm->run(m.narrow.data(), mlp.down.ptr(), mlp.down.elem, T, H, mlp.inter,
                    m.mlp_out.data(), H);
        residual_add(m.x.data(), m.mlp_out.data(), T, H, or_null(mlp.down_bias), post_ffn, eps, s);
        continue;
      }
      // Mixture of experts: route on the GPU, then one GEMM chain per expert over its tokens
      // (the token lists come back to the host: the GEMM shapes depend on them).
      rms_norm(m.x.data(), T, H, ffn_norm, eps, m.norm32.data(), Elem::kF32, s);
      const void* router_in = m.norm32.data();
      if (L.router.elem != Elem::kF32) {
        cast(m.norm32.data(), T * H, m.narrow.data(), L.router.elem, s);
        router_in = m.narrow.data();
      }
      const int E = int(L.experts.size());
      m.gemm->run(router_in, L.router.ptr(), L.router.elem, T, E, H, m.router_logits.data(), E);
      moe_route(m.router_logits.data(), T, E, L.top_k, L.norm_topk, m.expert_ids.data(),
                m.expert_weights.data(), s);
      std::vector<int32_t> ids(size_t(T * L.top_k));
      std::vector<float> weights(ids.size());
      TURBOKV_CUDA_CHECK(cudaMemcpyAsync(ids.data(), m.expert_ids.data(), ids.size() * 4,
                                         cudaMemcpyDeviceToHost, s));
      TURBOKV_CUDA_CHECK(cudaMemcpyAsync(weights.data(), m.expert_weights.data(),
                                         weights.size() * 4, cudaMemcpyDeviceToHost, s));
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));
      // Per expert, its tokens and their weights, laid out expert after expert.
      std::vector<int32_t> rows_of;
      std::vector<float> weight_of;
      std::vector<std::pair<int64_t, int64_t>> range(size_t(E), {0, 0});
      for (int e = 0; e < E; ++e) {
        range[size_t(e)].first = int64_t(rows_of.size());
        for (int64_t t = 0; t < T; ++t) {
          for (int k = 0; k < L.top_k; ++k) {
            if (ids[size_t(t * L.top_k + k)] == e) {
              rows_of.push_back(int32_t(t));
              weight_of.push_back(weights[size_t(t * L.top_k + k)]);
            }
          }
        }
        range[size_t(e)].second = int64_t(rows_of.size()) - range[size_t(e)].first;
      }
      const int32_t* d_rows = m.staging.put(rows_of.data(), rows_of.size(), s);
      const float* d_weights = m.staging.put(weight_of.data(), weight_of.size(), s);
      TURBOKV_CUDA_CHECK(cudaMemsetAsync(m.moe_out.data(), 0, size_t(T * H) * 4, s));
      for (int e = 0; e < E; ++e) {
        const auto [begin, count] = range[size_t(e)];
        if (count == 0) continue;
        const DeviceMlp& x = L.experts[size_t(e)];
        gather_rows(m.norm32.data(), H, d_rows + begin, count, m.expert_x.data(), s);
        cast(m.expert_x.data(), count * H, m.expert_narrow.data(), x.gate_up.elem, s);
        m.gemm->run(m.expert_narrow.data(), x.gate_up.ptr(), x.gate_up.elem, count, 2 * x.inter,
                    H, m.expert_gate_up.data(), 2 * x.inter);
        gated_activation(m.expert_gate_up.data(), count, x.inter, or_null(x.gate_bias),
                         or_null(x.up_bias), c.activation, m.expert_narrow.data(), x.down.elem, s);
        m.gemm->run(m.expert_narrow.data(), x.down.ptr(), x.down.elem, count, H, x.inter,
                    m.expert_out.data(), H);
        if (x.down_bias.size() > 0) {
          throw Unsupported("--device cuda: MoE experts with a down_proj bias");
        }
        scatter_add_weighted(m.moe_out.data(), m.expert_out.data(), d_rows + begin,
                             d_weights + begin, count, H, s);
      }
      residual_add(m.x.data(), m.moe_out.data(), T, H, nullptr, post_ffn, eps, s);
    }

    // Logits of the rows that need them (as DecoderModel::write_logits).
    std::vector<int32_t> rows;
    std::vector<float*> destinations;
    for (const StepSlice& o : order) {
      const Chunk& chunk = *o.slice.chunk;
      if (chunk.logits != nullptr && chunk.all_logits) {
        for (int i = 0; i < o.slice.count; ++i) {
          rows.push_back(int32_t(o.row + i));
          destinations.push_back(chunk.logits + int64_t(o.slice.begin + i) * c.vocab_size);
        }
      } else if (chunk.logits != nullptr && o.slice.begin + o.slice.count == chunk.n_tokens) {
        rows.push_back(int32_t(o.row + o.slice.count - 1));
        destinations.push_back(chunk.logits);
      }
    }
    const int64_t V = c.vocab_size;
    const int32_t* d_rows = m.staging.put(rows.data(), rows.size(), s);
    for (size_t b = 0; b < rows.size(); b += size_t(kLogitRows)) {
      const int64_t n = std::min<int64_t>(kLogitRows, int64_t(rows.size() - b));
      gather_rows(m.x.data(), H, d_rows + b, n, m.norm32.data(), s);
      rms_norm(m.norm32.data(), n, H, m.final_norm.data(), eps, m.narrow.data(), m.lm_head->elem,
               s);
      m.gemm->run(m.narrow.data(), m.lm_head->ptr(), m.lm_head->elem, n, V, H, m.logits.data(), V);
      if (c.final_logit_softcap > 0) softcap(m.logits.data(), n * V, c.final_logit_softcap, s);
      TURBOKV_CUDA_CHECK(cudaMemcpyAsync(m.host_logits.data(), m.logits.data(),
                                         size_t(n * V) * 4, cudaMemcpyDeviceToHost, s));
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(destinations[b + size_t(i)], m.host_logits.data() + i * V, size_t(V) * 4);
      }
    }
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

}  // namespace turbokv::cuda
