// CudaDecoderModel (cuda_decoder.h): weight upload, step buffers, and the forward pass.
#include "model/cuda/cuda_decoder.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/qmatmul.h"
#include "model/cuda/device_recurrent_state.h"
#include "model/cuda/hybrid_forward.h"
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

// A weight matrix on the GPU as stored: dense elements of elem [rows, cols], or quantized
// blocks (MLX affine, GGUF) in one or more row ranges (q, k and v of different GGUF types).
struct DeviceMatrix {
  DeviceBuffer<uint8_t> data;  // dense only
  Elem elem = Elem::kF32;
  int64_t rows = 0, cols = 0;
  std::vector<std::pair<int64_t, DeviceQuantMatrix>> quant;  // (first row, part)
  bool quantized() const { return !quant.empty(); }
  const void* ptr() const { return data.data(); }
};

// Uploads the row-wise concatenation of parts (same cols; e.g. q, k, v): one dense buffer when
// every part is dense of one dtype, quantized parts (fused where their layouts match) otherwise.
DeviceMatrix upload_rows(std::initializer_list<const WeightMatrix*> parts, size_t* total) {
  DeviceMatrix m;
  const WeightMatrix& first = **parts.begin();
  m.cols = first.cols;
  bool dense = true;
  for (const WeightMatrix* p : parts) {
    if (p->cols != m.cols) throw Unsupported("--device cuda: fused projections of other widths");
    dense = dense && p->format == WeightFormat::kDense;
    m.rows += p->rows;
  }
  if (!dense) {
    int64_t row = 0;
    std::vector<const WeightMatrix*> group;
    auto flush = [&] {
      if (group.empty()) return;
      int64_t rows = 0;
      for (const WeightMatrix* g : group) rows += g->rows;
      DeviceQuantMatrix q =
          group.size() == 1   ? upload_quant_matrix(*group[0])
          : group.size() == 2 ? upload_quant_rows({group[0], group[1]})
                              : upload_quant_rows({group[0], group[1], group[2]});
      *total += size_t(q.view.rows * q.view.row_bytes());
      m.quant.emplace_back(row - rows, std::move(q));
      group.clear();
    };
    for (const WeightMatrix* p : parts) {
      if (p->format == WeightFormat::kDense) {
        throw Unsupported("--device cuda: a fused projection mixing quantized and dense parts");
      }
      if (!group.empty() && !same_quant_layout(*group.front(), *p)) flush();
      group.push_back(p);
      row += p->rows;
    }
    flush();
    return m;
  }
  for (const WeightMatrix* p : parts) {
    if (p->dtype != first.dtype) throw Unsupported("--device cuda: fused projections of mixed dtypes");
  }
  // The reference mode holds dense weights in fp32, so their products take fp32 activations.
  const bool widen = f32_reference_mode();
  m.elem = elem_of(first.dtype);
  if (widen) m.elem = Elem::kF32;
  const size_t row_bytes = size_t(m.cols) * elem_bytes(m.elem);
  m.data = DeviceBuffer<uint8_t>(size_t(m.rows) * row_bytes);
  upload_dense_parts(parts, widen, m.data.data());
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
// A reallocation bumps *generation (captured graphs hold the old address).
class Workspace {
 public:
  Workspace(bool zeroed, int64_t* generation) : zeroed_(zeroed), generation_(generation) {}
  void* get(size_t bytes, cudaStream_t stream) {
    if (bytes > buffer_.size()) {
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
      buffer_ = DeviceBuffer<uint8_t>(std::max(bytes, 2 * buffer_.size()));
      if (zeroed_) buffer_.zero();
      ++*generation_;
    }
    return buffer_.data();
  }

 private:
  bool zeroed_;
  int64_t* generation_;
  DeviceBuffer<uint8_t> buffer_;
};

// Page-locked host memory (the targets of copies a CUDA graph holds).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t n) : n_(n) {
    if (n > 0) TURBOKV_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p_), n * sizeof(T), 0));
  }
  ~PinnedBuffer() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  T* data() { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// The host data a step's kernels read (tokens, positions, block tables, lengths, ...), laid out
// in 16-byte aligned sections and uploaded in one copy: offsets are the same on the device.
class Blob {
 public:
  template <typename T>
  size_t add(const T* data, size_t count) {
    const size_t at = align16(bytes_.size());
    bytes_.resize(at + count * sizeof(T));
    if (count > 0) std::memcpy(bytes_.data() + at, data, count * sizeof(T));
    return at;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// One step's bookkeeping: the slices in execution order and where their rows are.
struct StepSlice {
  ChunkSlice slice;
  int64_t row = 0;    // first row of the slice in the step's buffers
  int64_t first = 0;  // position of its first token
};

// Rows of a step that a product takes in one call under batch-invariant decoding: a group of
// consecutive decode rows, or one prefill slice.
struct RowRun {
  int64_t row = 0, rows = 0;
  bool decode = false;
};

// The product calls of batch-invariant runs: f(first row, rows, decode) once per prefill slice
// and once per group of at most `group` consecutive decode rows.
template <typename F>
void for_each_call(const std::vector<RowRun>& runs, int64_t group, F&& f) {
  for (const RowRun& r : runs) {
    for (int64_t r0 = 0; r0 < r.rows; r0 += r.decode ? group : r.rows) {
      f(r.row + r0, r.decode ? std::min(group, r.rows - r0) : r.rows, r.decode);
    }
  }
}

// One attention call: sub consecutive sequences (from index i of the run) with n_q queries.
struct AttentionCall {
  int i = 0, sub = 0, n_q = 0, max_len = 0;
  size_t q_start = 0;  // blob offset of [sub + 1] query row starts
  size_t workspace_bytes = 0;
};

// One run of consecutive slices whose caches share a layer's format: one append, and its
// attention calls. Offsets are into the step's blob.
struct RunPlan {
  size_t r0 = 0, r1 = 0;
  const DeviceFormat* format = nullptr;
  int stride = 0, max_len = 0, rows = 0;
  size_t table = 0, lens = 0, states = 0, row_seq = 0, row_pos = 0;
  std::vector<AttentionCall> calls;
};

// A decode step planned whole before any kernel runs (graph steps).
struct StepPlan {
  Blob blob;
  size_t tokens = 0, positions = 0, logit_rows = 0;
  int64_t n_logits = 0;
  std::vector<std::vector<RunPlan>> layers;
  std::string signature;  // equal signatures: the same kernels with the same arguments
};

// A captured decode step: its graph, the page-locked copy of the step's blob it uploads, and
// the page-locked logits it writes.
struct StepGraph {
  cudaGraphExec_t exec = nullptr;
  PinnedBuffer<uint8_t> blob;
  DeviceBuffer<uint8_t> device_blob;
  PinnedBuffer<float> logits;
  ~StepGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
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
  DeviceBuffer<uint8_t> act_narrow;  // [T, I]: the MLP activation from gemv_gated
  DeviceBuffer<float> router_logits, moe_out, expert_x, expert_gate_up, expert_out;
  DeviceBuffer<uint8_t> expert_narrow;
  DeviceBuffer<int32_t> expert_ids, expert_rows;
  DeviceBuffer<float> expert_weights;
  PinnedBuffer<float> host_logits;  // [kLogitRows, vocab]
  Staging staging;
  int64_t workspace_generation = 0;
  Workspace zeroed_ws{true, &workspace_generation}, plain_ws{false, &workspace_generation};
  // Decode steps by signature: run eagerly the first time (it loads every kernel the step
  // uses), captured the second, replayed after.
  std::map<std::string, std::unique_ptr<StepGraph>> graphs;
  int64_t graphs_workspace_generation = 0;  // the workspaces the graphs were captured with
  static constexpr size_t kMaxGraphs = 256;
  bool graphs_enabled = true;

  ~Impl() {
    graphs.clear();
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  void step(const ModelConfig& c, const DecoderModel& host, std::vector<StepSlice>& order);
  void run_eager(const ModelConfig& c, const DecoderModel& host,
                 const std::vector<StepSlice>& order, int64_t T,
                 const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                 const std::vector<int32_t>& rows, const std::vector<float*>& destinations);
  // Graphs are for decode steps whose kernels need no host decision mid-step.
  bool graph_eligible(const ModelConfig& c, const std::vector<StepSlice>& order) const;
  void run_layers(const ModelConfig& c, const DecoderModel& host,
                  const std::vector<StepSlice>& order, int64_t T, const int32_t* d_tokens,
                  const int32_t* d_positions, const StepPlan* plan, const uint8_t* plan_base);
  std::vector<RunPlan> plan_runs(const ModelConfig& c, int layer,
                                 const std::vector<StepSlice>& order, Blob& blob,
                                 bool graph) const;
  void enqueue_appends(const std::vector<StepSlice>& order, const std::vector<RunPlan>& runs,
                       const uint8_t* base);
  // The append arguments of one run (blob offsets at base).
  void append_args(const std::vector<StepSlice>& order, const RunPlan& run, const uint8_t* base,
                   PagedBatch* batch, AppendRows* rows) const;
  void enqueue_attention(const std::vector<StepSlice>& order, const std::vector<RunPlan>& runs,
                         const uint8_t* base, const AttentionOptions& o);
  // Logits of n <= kLogitRows rows of x (d_rows: their indices) into host_out [n, vocab]
  // (page-locked), queued.
  void enqueue_logits(const ModelConfig& c, const int32_t* d_rows, int64_t n, float* host_out);

  // y [m, w.rows] (row stride ldy) = x · wᵀ. x32: the input in fp32 (what quantized weights
  // read; may be null for dense weights when xn is given); xn: the input already narrowed to
  // w.elem (dense weights), or null to narrow x32 here.
  void linear(const DeviceMatrix& w, const float* x32, const void* xn, int64_t m, float* y,
              int64_t ldy);
  // RMSNorm of x [T, H] for the input of w: {fp32 rows, rows narrowed to w.elem} (one of them
  // null), written to norm32 or narrow.
  // x += y + bias, then norm_for(w, x, ..., weight) in one kernel (no post norm).
  std::pair<const float*, const void*> residual_norm_for(const DeviceMatrix& w, float* x,
                                                         const float* y, int64_t T, int64_t H,
                                                         const float* bias, const float* weight,
                                                         float eps);
  std::pair<const float*, const void*> norm_for(const DeviceMatrix& w, const float* x, int64_t T,
                                                int64_t H, const float* weight, float eps);

  // Batch-invariant decoding (CudaModelOptions::batch_invariant): > 0, the key split of decode
  // attention; step_runs, the step's rows as the products take them.
  int invariant_split_tokens = 0;
  std::vector<RowRun> step_runs;
  // linear over the runs of rows (step_runs, or logit rows in groups), each its own call: a
  // row's products then depend on its own slice alone. Decode groups of fp16 / bf16 weights go
  // to the GEMV (at most kGemvMaxRows rows, whose sums per row do not depend on the group);
  // other weights take decode rows one by one (cuBLAS and the quantized kernels choose by the
  // number of rows).
  void linear_runs(const DeviceMatrix& w, const float* x32, const void* xn, int64_t m, float* y,
                   int64_t ldy, const std::vector<RowRun>* runs);
  AttentionOptions call_options(const AttentionOptions& o, const AttentionCall& call) const {
    AttentionOptions r = o;
    if (invariant_split_tokens > 0 && call.n_q == 1) r.split_tokens = invariant_split_tokens;
    return r;
  }

  int heads = 0, kv_heads = 0, head_dim = 0;
  QuantScratch qscratch;        // quantized prefill GEMMs (empty for dense models)
  DeviceBuffer<float> act32;    // [T, I]: the MLP activation for quantized down projections

  // Models with layers beyond plain attention run on their own executor (hybrid_forward.h).
  std::unique_ptr<HybridForward> hybrid;
};

// The plain-attention families always run here; the rest (layer kinds, per-layer geometry,
// grouped or shared-expert MoE) on HybridForward, which says what it cannot run.
std::string cuda_unsupported_reason(const ModelConfig& c) {
  return needs_hybrid_forward(c) ? hybrid_unsupported_reason(c) : "";
}

// The KV pool takes what is left (a fraction of it), or the bytes asked for.
static size_t kv_pool_bytes(const CudaModelOptions& options, size_t weight_bytes) {
  size_t free_bytes = 0, total_bytes = 0;
  TURBOKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t reserve = size_t(1) << 30;  // workspaces, cuBLAS, the zero blocks
  size_t pool = options.kv_cache_bytes;
  if (pool == 0) {
    pool = free_bytes > reserve ? size_t(double(free_bytes - reserve) * options.kv_memory_fraction)
                                : 0;
  }
  if (pool < DeviceBlockPool::kChunkBytes) {
    throw InvalidArgument(str_cat("--kv-cache-gb: ", pool >> 20, " MiB is below the KV pool's ",
                                  "smallest size, one chunk of ",
                                  DeviceBlockPool::kChunkBytes >> 20, " MiB"),
                          "kv_cache_gb");
  }
  if (pool + reserve / 2 > free_bytes) {
    throw Error(str_cat("--device cuda: ", pool >> 20, " MiB for the KV cache does not fit next ",
                        "to the model (", free_bytes >> 20, " MiB of GPU memory free after ",
                        weight_bytes >> 20, " MiB of weights)"));
  }
  return pool;
}

CudaDecoderModel::CudaDecoderModel(std::unique_ptr<DecoderModel> host,
                                   const CudaModelOptions& options)
    : host_(std::move(host)), impl_(std::make_unique<Impl>()) {
  if (!device_available()) {
    throw Unsupported("--device cuda: no CUDA device is available on this machine");
  }
  const ModelConfig& c = host_->config();
  if (const std::string why = cuda_unsupported_reason(c); !why.empty()) {
    throw Unsupported(str_cat("--device cuda: ", why, " do not run on the GPU yet"));
  }
  Impl& m = *impl_;
  // TURBOKV_CUDA_GRAPHS=0: every step eager (debugging, and the benchmark's comparison).
  const char* graphs_env = std::getenv("TURBOKV_CUDA_GRAPHS");
  m.graphs_enabled = graphs_env == nullptr || std::string(graphs_env) != "0";
  m.heads = c.num_heads;
  m.kv_heads = c.num_kv_heads;
  m.head_dim = c.head_dim;
  TURBOKV_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  m.gemm = std::make_unique<Gemm>(m.stream);
  if (options.batch_invariant) {
    if (needs_hybrid_forward(c) || c.num_experts > 0) {
      throw Unsupported(
          "--batch-invariant: batch-invariant decoding on the GPU covers attention models with "
          "dense MLPs; this model's linear-attention, per-layer or expert layers are not covered");
    }
    // Decode splits of fixed length, long enough that one sequence at the model's longest
    // context fits one wave of the fused kernels (a block per SM, kv_heads x row groups per
    // split), at least 1024 keys; a multiple of 256 (the fused and the paged kernels' units).
    const int64_t ctx = c.max_position_embeddings > 0 ? c.max_position_embeddings : 131072;
    const int64_t row_groups = (c.num_heads / std::max(c.num_kv_heads, 1) + 7) / 8;
    const int64_t per_sequence =
        std::max<int64_t>(1, sm_count() / (c.num_kv_heads * row_groups));
    const int64_t split = (ctx + per_sequence - 1) / per_sequence;
    m.invariant_split_tokens = int(std::max<int64_t>(1024, (split + 255) / 256 * 256));
  }
  if (needs_hybrid_forward(c)) {
    m.hybrid = std::make_unique<HybridForward>(*host_, m.stream, *m.gemm, options.max_step_tokens);
    weight_bytes_ = m.hybrid->weight_bytes();
    caches_ =
        std::make_unique<DeviceCacheContext>(kv_pool_bytes(options, weight_bytes_), m.stream);
    return;
  }

  // Weights: check they fit before the first allocation.
  size_t need = 0;
  auto matrix_bytes = [](const WeightMatrix& w) { return size_t(w.total_bytes()); };
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
      if (d.router.quantized() || d.experts.front().gate_up.quantized()) {
        throw Unsupported("--device cuda: quantized MoE experts have no GPU path yet");
      }
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
  if (m.invariant_split_tokens > 0 &&
      (m.rope_global.dynamic || (m.has_local && m.rope_local.dynamic))) {
    throw Unsupported(
        "--batch-invariant: this model's dynamic RoPE scaling depends on the longest sequence of "
        "each step, so its outputs cannot be independent of the batch");
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
  m.act_narrow = DeviceBuffer<uint8_t>(size_t(T * std::max<int64_t>(inter, 1)) * 4);
  bool any_quantized = m.embed.quantized() || m.lm_head->quantized();
  for (const DeviceLayer& d : m.layers) {
    any_quantized = any_quantized || d.qkv.quantized() || d.o.quantized() ||
                    d.mlp.gate_up.quantized() || d.mlp.down.quantized();
  }
  if (any_quantized) {
    m.qscratch = QuantScratch(T, widest);
    m.act32 = DeviceBuffer<float>(size_t(T * std::max<int64_t>(inter, 1)));
  }
  m.logits = DeviceBuffer<float>(size_t(kLogitRows) * c.vocab_size);
  m.host_logits = PinnedBuffer<float>(size_t(kLogitRows) * c.vocab_size);
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

  caches_ = std::make_unique<DeviceCacheContext>(kv_pool_bytes(options, weight_bytes_), m.stream);
}

CudaDecoderModel::~CudaDecoderModel() {
  caches_.reset();  // before the stream goes
}

bool CudaDecoderModel::f32_activations() { return f32_reference_mode(); }

bool CudaDecoderModel::decode_uses_int8() const {
  if (!gpu_int8_activations_enabled()) return false;
  // quant_matmul takes the int8 GEMV for one row of x on the matrices it supports: MLX
  // 4-bit, the layout whose integer kernels read x in nibble order.
  auto int8 = [](const WeightMatrix& w) { return uses_nibble_order(w); };
  auto mlp = [&](const MlpWeights& m) { return int8(m.gate) || int8(m.up) || int8(m.down); };
  if (int8(host_->lm_head())) return true;
  for (const LayerWeights& L : host_->layers()) {
    if (int8(L.q) || int8(L.k) || int8(L.v) || int8(L.o) || mlp(L.mlp)) return true;
    if (L.moe && (std::any_of(L.moe->experts.begin(), L.moe->experts.end(), mlp) ||
                  (L.moe->shared_expert && mlp(*L.moe->shared_expert)))) {
      return true;
    }
  }
  return false;
}

size_t CudaDecoderModel::kv_bytes_for(const ResolvedKV& kv, int64_t tokens) const {
  const bool fused = host_->config().attn_logit_softcap == 0;
  const int64_t n = std::max<int64_t>(tokens, 0);
  size_t bytes = 0;
  for (const LayerCachePlan& p : plan_layer_caches(layer_specs(), kv)) {
    if (p.kind == LayerCacheKind::kRecurrent) {  // one block per sequence, its whole life
      const size_t state = DeviceRecurrentState::pool_block_bytes(p.recurrent);
      if (state > 0) bytes += DeviceBlockPool::bytes_for_blocks(1, state);
      continue;
    }
    if (p.kind != LayerCacheKind::kDense && p.kind != LayerCacheKind::kRotating &&
        p.kind != LayerCacheKind::kTurboQuant && p.kind != LayerCacheKind::kUniform) {
      continue;
    }
    // The layer's format's state block (split orders, means, sink rows) from the start.
    const std::shared_ptr<const DeviceFormat> format = caches_->format(p, DenseElem::kF16, fused);
    const size_t state = DeviceKVCache::state_block_bytes(*format);
    if (state > 0) bytes += DeviceBlockPool::bytes_for_blocks(1, state);
    // A staged layer holds its dense rows until it converts: count the larger dense blocks.
    size_t block = format->block_bytes();
    if (p.quantized_kv_start > 0 && p.kind != LayerCacheKind::kDense &&
        p.kind != LayerCacheKind::kRotating) {
      LayerCachePlan held = p;
      held.kind = LayerCacheKind::kDense;
      block = caches_->format(held, DenseElem::kF16, fused)->block_bytes();
    }
    const int64_t held_tokens =
        p.kind == LayerCacheKind::kRotating ? std::min<int64_t>(n, p.window + kBlockTokens) : n;
    const int64_t blocks = (held_tokens + kBlockTokens - 1) / kBlockTokens + 1;  // + a spare
    bytes += DeviceBlockPool::bytes_for_blocks(blocks, block);
  }
  return bytes;
}

LayerCaches CudaDecoderModel::make_caches(const ResolvedKV& kv, DenseElem dense_elem) const {
  const bool fused = host_->config().attn_logit_softcap == 0;
  if (impl_->hybrid) {
    return HybridForward::make_caches(*caches_, plan_layer_caches(layer_specs(), kv), dense_elem,
                                      fused);
  }
  return make_device_layer_caches(*caches_, plan_layer_caches(layer_specs(), kv), dense_elem,
                                  fused);
}


namespace {

DeviceKVCache& device_cache(const Model::Chunk& chunk, int layer) {
  auto* cache = dynamic_cast<DeviceKVCache*>((*chunk.caches)[size_t(layer)].get());
  if (cache == nullptr) {
    throw InvalidArgument(str_cat("layer ", layer, ": the CUDA model needs GPU caches (got a ",
                                  (*chunk.caches)[size_t(layer)]->type_name(), " CPU cache)"));
  }
  return *cache;
}

// Block tables of graph steps are padded to a few sizes per octave, so one graph serves a
// sequence while it grows by up to a quarter.
int bucket_blocks(size_t blocks) {
  size_t b = 1;
  while (b * 8 < blocks) b *= 2;  // b: blocks / 8 rounded down to a power of two, at least 1
  return int((blocks + b - 1) / b * b);
}

template <typename T>
const T* at(const uint8_t* base, size_t offset) {
  return reinterpret_cast<const T*>(base + offset);
}

}  // namespace

std::vector<RunPlan> CudaDecoderModel::Impl::plan_runs(const ModelConfig& c, int l,
                                                        const std::vector<StepSlice>& order,
                                                        Blob& blob, bool graph) const {
  AttentionOptions ao;
  ao.n_heads = c.num_heads;
  ao.scale = c.attention_scale;
  ao.logit_softcap = c.attn_logit_softcap;
  ao.sliding_window = c.sliding_window[size_t(l)];
  std::vector<RunPlan> runs;
  for (size_t r0 = 0; r0 < order.size();) {
    const DeviceFormat* f = &device_cache(*order[r0].slice.chunk, l).format();
    size_t r1 = r0 + 1;
    while (r1 < order.size() && &device_cache(*order[r1].slice.chunk, l).format() == f) ++r1;
    RunPlan run;
    run.r0 = r0;
    run.r1 = r1;
    run.format = f;
    const int n = int(r1 - r0);
    size_t blocks = 1;
    for (size_t i = r0; i < r1; ++i) {
      blocks = std::max(blocks, device_cache(*order[i].slice.chunk, l).blocks().size());
    }
    run.stride = graph ? bucket_blocks(blocks) : int(blocks);
    std::vector<const uint8_t*> table(size_t(n) * size_t(run.stride));
    std::vector<int> lens(static_cast<size_t>(n));
    std::vector<TQSequenceState> states(static_cast<size_t>(n));
    std::vector<int> row_seq, row_pos;
    for (int i = 0; i < n; ++i) {
      const StepSlice& o = order[r0 + size_t(i)];
      const DeviceKVCache& cache = device_cache(*o.slice.chunk, l);
      for (size_t b = 0; b < size_t(run.stride); ++b) {
        const uint8_t* block = b < cache.blocks().size() ? cache.blocks()[b] : nullptr;
        table[size_t(i) * run.stride + b] = block != nullptr ? block : cache.zero_block();
      }
      lens[size_t(i)] = int(o.first + o.slice.count);
      states[size_t(i)] = cache.state();
      for (int t = 0; t < o.slice.count; ++t) {
        row_seq.push_back(i);
        row_pos.push_back(int(o.first + t));
      }
    }
    // Graph steps size their split grids for the padded table (blocks past a sequence's
    // length return at once), so the grid does not change while the sequence grows.
    run.max_len = graph ? run.stride * kBlockTokens : *std::max_element(lens.begin(), lens.end());
    run.rows = int(row_seq.size());
    run.table = blob.add(table.data(), table.size());
    run.lens = blob.add(lens.data(), lens.size());
    run.states = blob.add(states.data(), states.size());
    run.row_seq = blob.add(row_seq.data(), row_seq.size());
    run.row_pos = blob.add(row_pos.data(), row_pos.size());
    // Attention: the run's single-token slices in one call, every longer slice alone.
    for (int i = 0; i < n;) {
      int j = i + 1;
      if (order[r0 + size_t(i)].slice.count == 1) {
        while (j < n && order[r0 + size_t(j)].slice.count == 1) ++j;
      }
      AttentionCall call;
      call.i = i;
      call.sub = j - i;
      call.n_q = order[r0 + size_t(i)].slice.count;
      call.max_len = graph ? run.max_len : *std::max_element(lens.begin() + i, lens.begin() + j);
      std::vector<int> starts(static_cast<size_t>(call.sub) + 1);
      for (int b = 0; b <= call.sub; ++b) starts[size_t(b)] = b * call.n_q;
      call.q_start = blob.add(starts.data(), starts.size());
      PagedBatch shape;
      shape.table_stride = run.stride;
      shape.batch = call.sub;
      shape.max_len = call.max_len;
      QueryRows q;
      q.max_n_q = call.n_q;
      call.workspace_bytes = f->workspace_bytes(shape, q, call_options(ao, call));
      run.calls.push_back(call);
      i = j;
    }
    runs.push_back(std::move(run));
    r0 = r1;
  }
  return runs;
}

void CudaDecoderModel::Impl::append_args(const std::vector<StepSlice>& order, const RunPlan& run,
                                         const uint8_t* base, PagedBatch* batch,
                                         AppendRows* rows) const {
  const int64_t kv_dim = int64_t(kv_heads) * head_dim;
  batch->block_table = at<const uint8_t*>(base, run.table);
  batch->table_stride = run.stride;
  batch->seq_len = at<int>(base, run.lens);
  batch->batch = int(run.r1 - run.r0);
  batch->max_len = run.max_len;
  const int64_t row = order[run.r0].row;
  rows->k = k.data() + row * kv_dim;
  rows->v = v.data() + row * kv_dim;
  rows->row_seq = at<int>(base, run.row_seq);
  rows->row_pos = at<int>(base, run.row_pos);
  rows->rows = run.rows;
}

void CudaDecoderModel::Impl::enqueue_appends(const std::vector<StepSlice>& order,
                                             const std::vector<RunPlan>& runs,
                                             const uint8_t* base) {
  for (const RunPlan& run : runs) {
    PagedBatch batch;
    AppendRows rows;
    append_args(order, run, base, &batch, &rows);
    run.format->append(batch, at<TQSequenceState>(base, run.states), rows, stream);
  }
}

void CudaDecoderModel::Impl::enqueue_attention(const std::vector<StepSlice>& order,
                                               const std::vector<RunPlan>& runs,
                                               const uint8_t* base, const AttentionOptions& o) {
  const int64_t q_dim = int64_t(heads) * head_dim, kv_dim = int64_t(kv_heads) * head_dim;
  for (const RunPlan& run : runs) {
    for (const AttentionCall& call : run.calls) {
      PagedBatch batch;
      batch.block_table = at<const uint8_t*>(base, run.table) + size_t(call.i) * run.stride;
      batch.table_stride = run.stride;
      batch.seq_len = at<int>(base, run.lens) + call.i;
      batch.batch = call.sub;
      batch.max_len = call.max_len;
      QueryRows qr;
      const int64_t row = order[run.r0 + size_t(call.i)].row;
      qr.q = q.data() + row * q_dim;
      qr.out = attn.data() + row * q_dim;
      qr.q_start = at<int>(base, call.q_start);
      qr.max_n_q = call.n_q;
      // Recent tokens: the queries' own keys and values, the rows the step appended.
      qr.k_new = k.data() + row * kv_dim;
      qr.v_new = v.data() + row * kv_dim;
      void* ws = (run.format->zeroed_workspace() ? zeroed_ws : plain_ws)
                     .get(call.workspace_bytes, stream);
      const TQSequenceState* states = at<TQSequenceState>(base, run.states) + call.i;
      run.format->attend(batch, states, qr, call_options(o, call), call.n_q, ws,
                         call.workspace_bytes, stream);
      // The recent-token rings after the attention that reads them (same stream; no kernel
      // without recent tokens).
      run.format->update_recent(batch, states, qr, stream);
    }
  }
}

void CudaDecoderModel::Impl::linear(const DeviceMatrix& w, const float* x32, const void* xn,
                                    int64_t m, float* y, int64_t ldy) {
  if (w.quantized()) {
    for (const auto& [row, part] : w.quant) {
      quant_matmul(part, x32, m, y + row, ldy, qscratch, gemm->handle(), stream);
    }
    return;
  }
  if (xn == nullptr) {
    if (w.elem == Elem::kF32) {
      xn = x32;
    } else if (gemm->uses_gemv() && gemv_supported(x32, w.ptr(), w.elem, m, w.cols)) {
      gemv_f32_input(x32, w.ptr(), w.elem, m, w.rows, w.cols, y, ldy, false, stream);  // no cast
      return;
    } else {
      cast(x32, m * w.cols, narrow.data(), w.elem, stream);
      xn = narrow.data();
    }
  }
  gemm->run(xn, w.ptr(), w.elem, m, w.rows, w.cols, y, ldy);
}

void CudaDecoderModel::Impl::linear_runs(const DeviceMatrix& w, const float* x32, const void* xn,
                                         int64_t m, float* y, int64_t ldy,
                                         const std::vector<RowRun>* runs) {
  if (invariant_split_tokens == 0 || runs == nullptr) {
    linear(w, x32, xn, m, y, ldy);
    return;
  }
  const size_t xn_row = xn != nullptr ? size_t(w.cols) * elem_bytes(w.elem) : 0;
  const bool gemv = gemm->uses_gemv() && !w.quantized() && w.elem != Elem::kF32;
  const int64_t group = gemv ? kGemvMaxRows : 1;
  for_each_call(*runs, group, [&](int64_t row, int64_t n, bool) {
    linear(w, x32 != nullptr ? x32 + row * w.cols : nullptr,
           xn != nullptr ? static_cast<const uint8_t*>(xn) + size_t(row) * xn_row : nullptr, n,
           y + row * ldy, ldy);
  });
}

std::pair<const float*, const void*> CudaDecoderModel::Impl::residual_norm_for(
    const DeviceMatrix& w, float* xio, const float* y, int64_t T, int64_t H, const float* bias,
    const float* weight, float eps) {
  if (w.quantized()) {
    residual_add_norm(xio, y, T, H, bias, weight, eps, norm32.data(), Elem::kF32, stream);
    return {norm32.data(), nullptr};
  }
  residual_add_norm(xio, y, T, H, bias, weight, eps, narrow.data(), w.elem, stream);
  return {nullptr, narrow.data()};
}

std::pair<const float*, const void*> CudaDecoderModel::Impl::norm_for(
    const DeviceMatrix& w, const float* xin, int64_t T, int64_t H, const float* weight,
    float eps) {
  if (w.quantized()) {
    rms_norm(xin, T, H, weight, eps, norm32.data(), Elem::kF32, stream);
    return {norm32.data(), nullptr};
  }
  rms_norm(xin, T, H, weight, eps, narrow.data(), w.elem, stream);
  return {nullptr, narrow.data()};
}

void CudaDecoderModel::Impl::enqueue_logits(const ModelConfig& c, const int32_t* d_rows,
                                            int64_t n, float* host_out) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  gather_rows(x.data(), H, d_rows, n, out.data(), stream);
  const auto [x32, xn] = norm_for(*lm_head, out.data(), n, H, final_norm.data(),
                                  float(c.rms_norm_eps));
  // Batch-invariant: every logit row is a decode row (gathered), whatever slice it ends.
  const std::vector<RowRun> logit_runs = {RowRun{0, n, true}};
  linear_runs(*lm_head, x32, xn, n, logits.data(), V, &logit_runs);
  if (c.final_logit_softcap > 0) softcap(logits.data(), n * V, c.final_logit_softcap, stream);
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(host_out, logits.data(), size_t(n * V) * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
}

void CudaDecoderModel::Impl::run_layers(const ModelConfig& c, const DecoderModel& host,
                                        const std::vector<StepSlice>& order, int64_t T,
                                        const int32_t* d_tokens, const int32_t* d_positions,
                                        const StepPlan* plan, const uint8_t* plan_base) {
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_dim = int64_t(c.num_heads) * hd, kv_dim = int64_t(c.num_kv_heads) * hd;
  const float eps = float(c.rms_norm_eps);
  cudaStream_t s = stream;
  if (embed.quantized()) {
    quant_gather_rows(embed.quant.front().second, d_tokens, T, host.embedding_scale(), x.data(),
                      s);
  } else {
    embed_rows(embed.ptr(), embed.elem, H, d_tokens, T, host.embedding_scale(), x.data(), s);
  }
  // The next layer's normed input when the previous layer's last residual add computed it.
  std::optional<std::pair<const float*, const void*>> next_input;
  for (int l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& L = layers[size_t(l)];
    // Attention block.
    {
      const auto [x32, xn] = next_input ? *next_input
                                        : norm_for(L.qkv, x.data(), T, H, L.input_norm.data(), eps);
      next_input.reset();
      linear_runs(L.qkv, x32, xn, T, qkv.data(), q_dim + 2 * kv_dim, &step_runs);
    }
    const int window = c.sliding_window[size_t(l)];
    const Rope& rope = window > 0 && has_local ? rope_local : rope_global;
    QkvPostProblem qp;
    qp.qkv = qkv.data();
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
    qp.q = q.data();
    qp.k = k.data();
    qp.v = v.data();
    // Graph steps whose one cache format quantizes straight from the projection's output (the
    // fused TurboQuant formats): bias, RoPE and the append in one kernel.
    bool appended = false;
    if (plan != nullptr && plan->layers[size_t(l)].size() == 1 &&
        plan->layers[size_t(l)][0].rows == T) {
      const RunPlan& run = plan->layers[size_t(l)][0];
      PagedBatch batch;
      AppendRows rows;
      append_args(order, run, plan_base, &batch, &rows);
      appended = run.format->append_qkv(batch, rows, qp, s);
    }
    if (!appended) qkv_post(qp, s);

    AttentionOptions ao;
    ao.n_heads = c.num_heads;
    ao.scale = c.attention_scale;
    ao.logit_softcap = c.attn_logit_softcap;
    ao.sliding_window = window;
    if (plan != nullptr) {  // planned whole (graph steps): no host decision in between
      if (!appended) enqueue_appends(order, plan->layers[size_t(l)], plan_base);
      enqueue_attention(order, plan->layers[size_t(l)], plan_base, ao);
    } else {
      // Split codecs fix their channel orders from the first chunk (a download).
      for (const StepSlice& o : order) {
        DeviceKVCache& cache = device_cache(*o.slice.chunk, l);
        if (cache.needs_calibration()) {
          cache.calibrate(k.data() + o.row * kv_dim, v.data() + o.row * kv_dim, o.slice.count);
        }
      }
      Blob blob;
      std::vector<RunPlan> runs = plan_runs(c, l, order, blob, false);
      const uint8_t* base = staging.put(blob.bytes().data(), blob.bytes().size(), s);
      enqueue_appends(order, runs, base);
      bool converted = false;
      for (const StepSlice& o : order) {
        DeviceKVCache& cache = device_cache(*o.slice.chunk, l);
        const int64_t generation = cache.generation();
        cache.advance(o.slice.count);
        converted |= cache.generation() != generation;
      }
      if (converted) {  // a staged cache switched formats: plan its attention anew
        Blob after;
        runs = plan_runs(c, l, order, after, false);
        base = staging.put(after.bytes().data(), after.bytes().size(), s);
      }
      enqueue_attention(order, runs, base, ao);
    }
    linear_runs(L.o, attn.data(), nullptr, T, out.data(), H, &step_runs);
    // Feed-forward block. Without sandwich norms the residual add and the FFN norm are one
    // kernel (and the FFN's residual add and the next layer's input norm).
    const float* ffn_norm =
        c.sandwich_norms ? L.pre_feedforward_norm.data() : L.post_attention_norm.data();
    const float* post_ffn = c.sandwich_norms ? L.post_feedforward_norm.data() : nullptr;
    const bool fuse_norms = !c.sandwich_norms && !L.moe;
    if (!fuse_norms) {
      residual_add(x.data(), out.data(), T, H, or_null(L.o_bias),
                   c.sandwich_norms ? L.post_attention_norm.data() : nullptr, eps, s);
    }
    if (!L.moe) {
      const DeviceMlp& mlp = L.mlp;
      const auto [x32, xn] =
          fuse_norms ? residual_norm_for(mlp.gate_up, x.data(), out.data(), T, H,
                                         or_null(L.o_bias), ffn_norm, eps)
                     : norm_for(mlp.gate_up, x.data(), T, H, ffn_norm, eps);
      const bool gated_gemv = xn != nullptr && !mlp.down.quantized() &&
                              mlp.down.elem == mlp.gate_up.elem && gemm->uses_gemv();
      if (gated_gemv && invariant_split_tokens > 0 &&
          gemv_supported(xn, mlp.gate_up.ptr(), mlp.gate_up.elem, 1, H)) {
        // Batch-invariant: decode groups through the gate/up GEMV, prefill slices through the
        // product and the activation kernel, each run on its own.
        const size_t es = elem_bytes(mlp.gate_up.elem);
        for_each_call(step_runs, kGemvMaxRows, [&](int64_t row, int64_t n, bool decode) {
          const void* xr = static_cast<const uint8_t*>(xn) + size_t(row * H) * es;
          void* act = act_narrow.data() + size_t(row * mlp.inter) * es;
          if (decode) {
            gemv_gated(xr, mlp.gate_up.ptr(), mlp.gate_up.elem, n, mlp.inter, H,
                       or_null(mlp.gate_bias), or_null(mlp.up_bias), c.activation, act, s);
          } else {
            float* gu = gate_up.data() + row * 2 * mlp.inter;
            linear(mlp.gate_up, nullptr, xr, n, gu, 2 * mlp.inter);
            gated_activation(gu, n, mlp.inter, or_null(mlp.gate_bias), or_null(mlp.up_bias),
                             c.activation, act, mlp.down.elem, s);
          }
        });
        linear_runs(mlp.down, nullptr, act_narrow.data(), T, mlp_out.data(), H, &step_runs);
      } else if (gated_gemv && invariant_split_tokens == 0 &&
                 gemv_supported(xn, mlp.gate_up.ptr(), mlp.gate_up.elem, T, H)) {
        // Decode: the gate/up GEMV writes the activation itself.
        gemv_gated(xn, mlp.gate_up.ptr(), mlp.gate_up.elem, T, mlp.inter, H,
                   or_null(mlp.gate_bias), or_null(mlp.up_bias), c.activation,
                   act_narrow.data(), s);
        linear(mlp.down, nullptr, act_narrow.data(), T, mlp_out.data(), H);
      } else {
        linear_runs(mlp.gate_up, x32, xn, T, gate_up.data(), 2 * mlp.inter, &step_runs);
        if (mlp.down.quantized()) {
          gated_activation(gate_up.data(), T, mlp.inter, or_null(mlp.gate_bias),
                           or_null(mlp.up_bias), c.activation, act32.data(), Elem::kF32, s);
          linear_runs(mlp.down, act32.data(), nullptr, T, mlp_out.data(), H, &step_runs);
        } else {
          gated_activation(gate_up.data(), T, mlp.inter, or_null(mlp.gate_bias),
                           or_null(mlp.up_bias), c.activation, narrow.data(), mlp.down.elem, s);
          linear_runs(mlp.down, nullptr, narrow.data(), T, mlp_out.data(), H, &step_runs);
        }
      }
      if (post_ffn == nullptr && l + 1 < c.num_layers) {
        const DeviceLayer& next = layers[size_t(l) + 1];
        next_input = residual_norm_for(next.qkv, x.data(), mlp_out.data(), T, H,
                                       or_null(mlp.down_bias), next.input_norm.data(), eps);
      } else {
        residual_add(x.data(), mlp_out.data(), T, H, or_null(mlp.down_bias), post_ffn, eps, s);
      }
      continue;
    }
    // Mixture of experts: route on the GPU, then one GEMM chain per expert over its tokens
    // (the token lists come back to the host: the GEMM shapes depend on them).
    rms_norm(x.data(), T, H, ffn_norm, eps, norm32.data(), Elem::kF32, s);
    const void* router_in = norm32.data();
    if (L.router.elem != Elem::kF32) {
      cast(norm32.data(), T * H, narrow.data(), L.router.elem, s);
      router_in = narrow.data();
    }
    const int E = int(L.experts.size());
    gemm->run(router_in, L.router.ptr(), L.router.elem, T, E, H, router_logits.data(), E);
    moe_route(router_logits.data(), T, E, L.top_k, L.norm_topk, expert_ids.data(),
              expert_weights.data(), s);
    std::vector<int32_t> ids(size_t(T * L.top_k));
    std::vector<float> weights(ids.size());
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(ids.data(), expert_ids.data(), ids.size() * 4,
                                       cudaMemcpyDeviceToHost, s));
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(weights.data(), expert_weights.data(), weights.size() * 4,
                                       cudaMemcpyDeviceToHost, s));
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));
    // Per expert, its tokens and their weights, laid out expert after expert.
    std::vector<int32_t> rows_of;
    std::vector<float> weight_of;
    std::vector<std::pair<int64_t, int64_t>> range(static_cast<size_t>(E), {0, 0});
    for (int e = 0; e < E; ++e) {
      range[size_t(e)].first = int64_t(rows_of.size());
      for (int64_t t = 0; t < T; ++t) {
        for (int j = 0; j < L.top_k; ++j) {
          if (ids[size_t(t * L.top_k + j)] == e) {
            rows_of.push_back(int32_t(t));
            weight_of.push_back(weights[size_t(t * L.top_k + j)]);
          }
        }
      }
      range[size_t(e)].second = int64_t(rows_of.size()) - range[size_t(e)].first;
    }
    const int32_t* d_rows = staging.put(rows_of.data(), rows_of.size(), s);
    const float* d_weights = staging.put(weight_of.data(), weight_of.size(), s);
    TURBOKV_CUDA_CHECK(cudaMemsetAsync(moe_out.data(), 0, size_t(T * H) * 4, s));
    for (int e = 0; e < E; ++e) {
      const auto [begin, count] = range[size_t(e)];
      if (count == 0) continue;
      const DeviceMlp& xm = L.experts[size_t(e)];
      if (xm.down_bias.size() > 0) {
        throw Unsupported("--device cuda: MoE experts with a down_proj bias");
      }
      gather_rows(norm32.data(), H, d_rows + begin, count, expert_x.data(), s);
      cast(expert_x.data(), count * H, expert_narrow.data(), xm.gate_up.elem, s);
      gemm->run(expert_narrow.data(), xm.gate_up.ptr(), xm.gate_up.elem, count, 2 * xm.inter, H,
                expert_gate_up.data(), 2 * xm.inter);
      gated_activation(expert_gate_up.data(), count, xm.inter, or_null(xm.gate_bias),
                       or_null(xm.up_bias), c.activation, expert_narrow.data(), xm.down.elem, s);
      gemm->run(expert_narrow.data(), xm.down.ptr(), xm.down.elem, count, H, xm.inter,
                expert_out.data(), H);
      scatter_add_weighted(moe_out.data(), expert_out.data(), d_rows + begin, d_weights + begin,
                           count, H, s);
    }
    residual_add(x.data(), moe_out.data(), T, H, nullptr, post_ffn, eps, s);
  }
}

bool CudaDecoderModel::Impl::graph_eligible(const ModelConfig& c,
                                            const std::vector<StepSlice>& order) const {
  if (!graphs_enabled || c.num_experts > 0 || rope_global.dynamic ||
      (has_local && rope_local.dynamic)) {
    return false;
  }
  for (const StepSlice& o : order) {
    if (o.slice.count != 1) return false;
    const Model::Chunk& chunk = *o.slice.chunk;
    if (chunk.logits == nullptr) return false;
    for (int l = 0; l < c.num_layers; ++l) {
      const DeviceKVCache& cache = device_cache(chunk, l);
      if (cache.needs_calibration() || cache.converts_after(1)) return false;
    }
  }
  return true;
}

void CudaDecoderModel::Impl::step(const ModelConfig& c, const DecoderModel& host,
                                  std::vector<StepSlice>& order) {
  cudaStream_t s = stream;
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
  if (T > max_tokens) throw Error("CUDA forward: a step larger than its buffers");
  step_runs.clear();
  for (const StepSlice& o : order) {
    const bool decode = o.slice.count == 1;
    if (decode && !step_runs.empty() && step_runs.back().decode) {
      ++step_runs.back().rows;
    } else {
      step_runs.push_back(RowRun{o.row, o.slice.count, decode});
    }
  }
  int64_t seq_len = 0;
  for (int32_t p : positions) seq_len = std::max<int64_t>(seq_len, p + 1);
  for (Rope* r : {&rope_global, &rope_local}) {
    if (r->dynamic && r->uploaded_for != seq_len) {
      const RopeTable t = make_rope_table(r->config, c.head_dim, seq_len);
      TURBOKV_CUDA_CHECK(cudaMemcpyAsync(r->inv_freq.data(), t.inv_freq.data(),
                                         t.inv_freq.size() * sizeof(float),
                                         cudaMemcpyHostToDevice, s));
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));  // the host table goes out of scope
      r->attention_scaling = t.attention_scaling;
      r->uploaded_for = seq_len;
    }
  }
  // The rows that need logits and where each goes (as DecoderModel::write_logits).
  std::vector<int32_t> rows;
  std::vector<float*> destinations;
  for (const StepSlice& o : order) {
    const Model::Chunk& chunk = *o.slice.chunk;
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

  if (graph_eligible(c, order)) {
    // The whole step planned first, then captured once per signature and replayed.
    StepPlan plan;
    plan.tokens = plan.blob.add(tokens.data(), tokens.size());
    plan.positions = plan.blob.add(positions.data(), positions.size());
    plan.logit_rows = plan.blob.add(rows.data(), rows.size());
    plan.n_logits = int64_t(rows.size());
    std::string& sig = plan.signature;
    sig = str_cat("T", T, " logits", plan.n_logits);
    for (int l = 0; l < c.num_layers; ++l) {
      plan.layers.push_back(plan_runs(c, l, order, plan.blob, true));
      for (const RunPlan& run : plan.layers.back()) {
        sig += str_cat(" ", static_cast<const void*>(run.format), ":", run.r1 - run.r0, ":",
                       run.stride);
        for (const AttentionCall& call : run.calls) {
          (run.format->zeroed_workspace() ? zeroed_ws : plain_ws).get(call.workspace_bytes, s);
          sig += str_cat("/", call.sub, "x", call.n_q);
        }
      }
    }
    if (graphs_workspace_generation != workspace_generation || graphs.size() > kMaxGraphs) {
      graphs.clear();  // they hold workspaces that are gone
      graphs_workspace_generation = workspace_generation;
    }
    auto seen = graphs.find(sig);
    if (seen == graphs.end()) {  // first sight: eager, and remember the signature
      graphs.emplace(sig, nullptr);
      run_eager(c, host, order, T, tokens, positions, rows, destinations);
      return;
    }
    std::unique_ptr<StepGraph>& graph = seen->second;
    const std::vector<uint8_t>& blob = plan.blob.bytes();
    if (graph == nullptr) {
      auto g = std::make_unique<StepGraph>();
      g->blob = PinnedBuffer<uint8_t>(blob.size());
      g->device_blob = DeviceBuffer<uint8_t>(blob.size());
      g->logits = PinnedBuffer<float>(size_t(plan.n_logits * V));
      std::memcpy(g->blob.data(), blob.data(), blob.size());
      const uint8_t* base = g->device_blob.data();
      cudaGraph_t captured;
      TURBOKV_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      TURBOKV_CUDA_CHECK(cudaMemcpyAsync(g->device_blob.data(), g->blob.data(), blob.size(),
                                         cudaMemcpyHostToDevice, s));
      run_layers(c, host, order, T, at<int32_t>(base, plan.tokens),
                 at<int32_t>(base, plan.positions), &plan, base);
      for (int64_t b = 0; b < plan.n_logits; b += kLogitRows) {
        enqueue_logits(c, at<int32_t>(base, plan.logit_rows) + b,
                       std::min<int64_t>(kLogitRows, plan.n_logits - b),
                       g->logits.data() + b * V);
      }
      TURBOKV_CUDA_CHECK(cudaStreamEndCapture(s, &captured));
      const cudaError_t err = cudaGraphInstantiate(&g->exec, captured, 0);
      cudaGraphDestroy(captured);
      TURBOKV_CUDA_CHECK(err);
      graph = std::move(g);
    } else {
      std::memcpy(graph->blob.data(), blob.data(), blob.size());
    }
    TURBOKV_CUDA_CHECK(cudaGraphLaunch(graph->exec, s));
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));
    for (const StepSlice& o : order) {
      for (int l = 0; l < c.num_layers; ++l) device_cache(*o.slice.chunk, l).advance(1);
    }
    for (size_t i = 0; i < destinations.size(); ++i) {
      std::memcpy(destinations[i], graph->logits.data() + int64_t(i) * V, size_t(V) * 4);
    }
    return;
  }

  run_eager(c, host, order, T, tokens, positions, rows, destinations);
}

void CudaDecoderModel::Impl::run_eager(const ModelConfig& c, const DecoderModel& host,
                                       const std::vector<StepSlice>& order, int64_t T,
                                       const std::vector<int32_t>& tokens,
                                       const std::vector<int32_t>& positions,
                                       const std::vector<int32_t>& rows,
                                       const std::vector<float*>& destinations) {
  cudaStream_t s = stream;
  const int64_t V = c.vocab_size;
  staging.reset();
  const int32_t* d_tokens = staging.put(tokens.data(), tokens.size(), s);
  const int32_t* d_positions = staging.put(positions.data(), positions.size(), s);
  run_layers(c, host, order, T, d_tokens, d_positions, nullptr, nullptr);
  const int32_t* d_rows = staging.put(rows.data(), rows.size(), s);
  for (size_t b = 0; b < rows.size(); b += size_t(kLogitRows)) {
    const int64_t n = std::min<int64_t>(kLogitRows, int64_t(rows.size() - b));
    enqueue_logits(c, d_rows + b, n, host_logits.data());
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(destinations[b + size_t(i)], host_logits.data() + i * V, size_t(V) * 4);
    }
  }
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(s));
}

void CudaDecoderModel::forward(std::span<const Chunk> chunks) const {
  const ModelConfig& c = host_->config();
  check_chunks(chunks, c.num_layers, c.vocab_size);
  if (impl_->hybrid) {
    impl_->hybrid->forward(chunks);
    return;
  }
  for (const Chunk& chunk : chunks) {
    for (int l = 0; l < c.num_layers; ++l) device_cache(chunk, l);
  }
  const std::vector<std::vector<ChunkSlice>> steps =
      impl_->invariant_split_tokens > 0 ? split_into_whole_steps(chunks, kForwardStepTokens)
                                        : split_into_steps(chunks, kForwardStepTokens);
  for (const std::vector<ChunkSlice>& step : steps) {
    // Execution order: sequences with the same cache formats together (one kernel call per
    // run and layer), single-token slices (decode) first inside a run.
    std::vector<StepSlice> order;
    for (const ChunkSlice& sl : step) {
      order.push_back(StepSlice{sl, 0, (*sl.chunk->caches)[0]->size()});
    }
    std::stable_sort(order.begin(), order.end(), [&](const StepSlice& a, const StepSlice& b) {
      for (int l = 0; l < c.num_layers; ++l) {
        const DeviceFormat* fa = &device_cache(*a.slice.chunk, l).format();
        const DeviceFormat* fb = &device_cache(*b.slice.chunk, l).format();
        if (fa != fb) return std::less<const DeviceFormat*>()(fa, fb);
      }
      return (a.slice.count == 1) > (b.slice.count == 1);
    });
    // Every cache gets its blocks for this step before any kernel runs, so a full pool fails
    // the step before it changes anything.
    for (const StepSlice& o : order) {
      for (int l = 0; l < c.num_layers; ++l) {
        device_cache(*o.slice.chunk, l).reserve_tokens(o.slice.count);
      }
    }
    impl_->step(c, *host_, order);
  }
}

}  // namespace turbokv::cuda
