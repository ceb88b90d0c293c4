// KV caches in GPU memory: the device counterparts of the CPU caches (kv/dense_kv_cache.h,
// turboquant_kv_cache.h, uniform_kv_cache.h), built from the same plan
// (kv/cache_policy.h: plan_layer_caches), holding byte-identical records in paged blocks
// (kernels/cuda/kvcache/paged.h) from one DeviceBlockPool, and saved / loaded through the CPU
// caches' file records (a cache saved on one device loads on the other).
//
// The CUDA model drives them in batches: per layer it groups the sequences whose caches share
// a DeviceFormat, grows each cache for the step's tokens, and queues one append and one
// attention call per group (device_batch.h). The KVCache interface's host-pointer append() and
// attend() do the same for one sequence and synchronize (tests, tools).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/kvcache/paged.h"
#include "kernels/cuda/model_ops.h"
#include "kv/cache_policy.h"
#include "kv/cuda/device_pool.h"
#include "kv/kv_cache.h"

namespace turbokv::cuda {

class DeviceFormat;

// What the device caches of one engine share: the block pool, the stream their work is queued
// on, and the formats (one per configuration, created on first use).
class DeviceCacheContext {
 public:
  DeviceCacheContext(size_t pool_bytes, cudaStream_t stream);
  ~DeviceCacheContext();

  DeviceBlockPool& pool() { return pool_; }
  cudaStream_t stream() const { return stream_; }

  // The shared format of a plan's layer (dense_elem for dense and rotating layers; fused: the
  // fused kernels may serve it, false under logit soft-capping); throws Unsupported naming the
  // configuration when the GPU cannot hold it.
  std::shared_ptr<const DeviceFormat> format(const LayerCachePlan& plan, DenseElem dense_elem,
                                             bool fused);

  // Scratch for the host-pointer paths and conversions: a device buffer of at least `bytes`,
  // reused (not thread-safe, like the rest).
  void* scratch(size_t bytes);

 private:
  DeviceBlockPool pool_;
  cudaStream_t stream_;
  std::vector<std::pair<std::string, std::shared_ptr<const DeviceFormat>>> formats_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

// How one kind of block is written and read; shared by every cache of that configuration.
class DeviceFormat {
 public:
  virtual ~DeviceFormat() = default;
  virtual std::string type_name() const = 0;  // the CPU cache's: "dense-f16", "turboquant", ...
  virtual int kv_heads() const = 0;
  virtual int head_dim() const = 0;
  virtual size_t block_bytes() const = 0;
  // Exact bytes of state per token (every KV head, keys and values): what nbytes() counts.
  virtual size_t bytes_per_token() const = 0;
  // True when the cache fixes per-sequence state from its first coded chunk (split channel
  // orders, centering means).
  virtual bool calibrates() const { return false; }
  // The first positions every sequence keeps as fp16 rows outside the blocks (TurboQuant sink
  // tokens; TQSequenceState::sink_keys / sink_values).
  virtual int sink_tokens() const { return 0; }
  // TurboQuant recent tokens (W; TQFormat::recent_tokens): attend() needs the queries' own
  // keys and values (QueryRows::k_new / v_new), and for W > 1 every sequence keeps a ring of its
  // last W - 1 positions as fp16 rows (TQSequenceState::recent_keys / recent_values) that
  // update_recent() writes after the attention.
  virtual int recent_tokens() const { return 0; }
  // Bytes a cache of `tokens` tokens holds, as the CPU cache's nbytes() counts them;
  // calibrated: its per-sequence state is fixed.
  virtual size_t nbytes(int64_t tokens, bool calibrated) const {
    (void)calibrated;
    return size_t(tokens) * bytes_per_token();
  }
  // True when attend() needs an all-zero workspace (and leaves it so): the fused kernels.
  virtual bool zeroed_workspace() const { return false; }

  virtual void append(const PagedBatch& batch, const TQSequenceState* states,
                      const AppendRows& rows, cudaStream_t stream) const = 0;
  // append() of rows straight from a fused QKV projection's output with qkv_post's bias and
  // RoPE (no q/k norm): qp.q gets the queries, the keys and values go into the blocks, qp.k and
  // qp.v are not written; rows.k / rows.v are unused. False (nothing queued) when the format
  // has no such kernel: the caller runs qkv_post and append().
  virtual bool append_qkv(const PagedBatch& batch, const AppendRows& rows,
                          const QkvPostProblem& qp, cudaStream_t stream) const {
    (void)batch, (void)rows, (void)qp, (void)stream;
    return false;
  }
  // Every sequence of `batch` has n_q queries (the forward calls decode and each prefill chunk
  // separately); q_start is still given for the generic kernels.
  virtual size_t workspace_bytes(const PagedBatch& batch, const QueryRows& q,
                                 const AttentionOptions& o) const = 0;
  virtual void attend(const PagedBatch& batch, const TQSequenceState* states, const QueryRows& q,
                      const AttentionOptions& o, int n_q, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) const = 0;
  // After attend() of the same batch and queries (q.k_new / v_new set, queued on the same
  // stream): each sequence's recent-token ring gets its last positions. No kernel unless
  // recent_tokens() > 1.
  virtual void update_recent(const PagedBatch& batch, const TQSequenceState* states,
                             const QueryRows& q, cudaStream_t stream) const {
    (void)batch, (void)states, (void)q, (void)stream;
  }

  // Host conversions (save/load, tests): the blocks of one sequence, downloaded
  // ([n_blocks][block_bytes]), to a CPU cache of `tokens` tokens of the same configuration,
  // and back. orders: the split channel orders ([kv_heads][head_dim] keys, then values) or
  // empty. sinks: the fp16 sink rows ([keys, values][kv_heads][sink_tokens][head_dim], the
  // first min(tokens, sink_tokens) rows of each head held) or empty. The CPU cache holds the
  // rows; state that is not in them (means) comes with its read_state().
  virtual std::unique_ptr<KVCache> to_host(const std::vector<uint8_t>& blocks, int64_t tokens,
                                           const std::vector<std::vector<int>>& key_orders,
                                           const std::vector<std::vector<int>>& value_orders,
                                           const std::vector<uint16_t>& sinks) const = 0;
  // An empty CPU cache of this configuration (what load() reads a record into).
  virtual std::unique_ptr<KVCache> host_cache() const = 0;
  // The blocks ([n_blocks][block_bytes], n_blocks = ceil(tokens / 256)) of a CPU cache.
  virtual std::vector<uint8_t> from_host(const KVCache& cache) const = 0;
  // Its sink rows in to_host()'s layout (empty without sink tokens).
  virtual std::vector<uint16_t> sinks_from_host(const KVCache& cache) const {
    (void)cache;
    return {};
  }
};

// Tokens of a device cache held by reference: whole blocks of one format, shared with the
// caches that hold them (the pool frees a block when its last holder lets go).
class DeviceKVRows final : public KVRows {
 public:
  DeviceKVRows(DeviceBlockPool& pool, std::shared_ptr<const DeviceFormat> format,
               std::vector<uint8_t*> blocks, int64_t tokens);
  ~DeviceKVRows() override;
  int64_t tokens() const override { return tokens_; }
  size_t nbytes() const override;
  const DeviceFormat* format() const { return format_.get(); }
  const std::vector<uint8_t*>& blocks() const { return blocks_; }

 private:
  DeviceBlockPool& pool_;
  std::shared_ptr<const DeviceFormat> format_;
  std::vector<uint8_t*> blocks_;
  int64_t tokens_;
};

// One sequence's cache of one layer.
class DeviceKVCache : public KVCache {
 public:
  // window > 0: a rotating cache (blocks wholly before the window are released).
  // staged (quantized_kv_start): the cache holds `format` (dense) until it has
  // quantized_kv_start tokens, then converts its whole history to `staged` in one step, as
  // kv/staged_kv_cache.h does on the CPU.
  DeviceKVCache(DeviceCacheContext& context, std::shared_ptr<const DeviceFormat> format,
                int window = 0, std::shared_ptr<const DeviceFormat> staged = nullptr,
                int64_t quantized_kv_start = 0);
  ~DeviceKVCache() override;

  std::string type_name() const override;
  int kv_heads() const override { return format_->kv_heads(); }
  int head_dim() const override { return format_->head_dim(); }
  int64_t size() const override { return size_; }
  void append(const float* k, const float* v, int n_tokens) override;
  void trim(int64_t n) override;
  size_t nbytes() const override;
  void attend(const float* q, int n_q, const AttentionParams& params, float* out) const override;
  // The CPU cache's records: the state from a CPU cache of the same configuration that saw the
  // same calibration tokens (state_host_), the rows downloaded. Unsupported for rotating and
  // staged caches. read_rows() re-uploads the whole cache (costly).
  void write_state(ByteWriter& out) const override;
  void read_state(ByteReader& in) override;
  void write_rows(ByteWriter& out, int64_t first, int64_t n) const override;
  void read_rows(ByteReader& in, int64_t n) override;
  int64_t calibration_tokens() const override;
  // Whole blocks (first and n multiples of kBlockTokens) are shared, not copied: the rows are
  // references to the blocks (DeviceKVRows), and append_rows() of such rows into a cache of the
  // same format at a block boundary puts the same blocks in its table. Anything else is copied
  // through the host.
  std::shared_ptr<const KVRows> copy_rows(int64_t first, int64_t n) const override;
  void append_rows(const KVRows& rows) override;

  // append() for keys and values already on the device ([n, kv_heads, head_dim] fp32), queued
  // on the context's stream and synchronized.
  void append_device(const float* k, const float* v, int n_tokens);

  // The pool bytes of the per-sequence state block a cache of format f holds next to its
  // blocks (split channel orders, centering means, sink rows, the recent-token ring; 0: none),
  // for admission.
  static size_t state_block_bytes(const DeviceFormat& f);

  // The CUDA model's path.
  const DeviceFormat& format() const { return *format_; }
  int window() const { return window_; }
  // Makes room for n more tokens: allocates blocks (throws PoolExhausted), and puts the rows of
  // the host-path appends (append(), append_device()) into the recent-token ring, so the
  // caller's next append and attention calls (QueryRows::k_new / v_new their own rows) and
  // update_recent() find the ring as the kernels keep it.
  void reserve_tokens(int n);
  // Before each append of a calibrating format until it is calibrated: fixes the split channel
  // orders and centering means from the chunk's rows (device pointers [n, kv_heads,
  // head_dim], downloaded and given to a CPU cache of the same configuration, which fixes
  // them once the chunk reaches past the sink tokens). A no-op once calibrated.
  void calibrate(const float* k, const float* v, int n);
  bool needs_calibration() const { return format_->calibrates() && !calibrated_; }
  // After the append kernels of n tokens are queued. A staged cache that reaches its
  // quantized_kv_start converts here (synchronously); generation() then changes.
  void advance(int n);
  int64_t generation() const { return generation_; }
  // True when appending n more tokens makes a staged cache convert.
  bool converts_after(int n) const { return staged_ && size_ + n >= quantized_kv_start_; }
  // Blocks of tokens [0, size + reserved): entries before first_block() are released (rotating)
  // and read as the zero block.
  const std::vector<uint8_t*>& blocks() const { return blocks_; }
  const uint8_t* zero_block() const;
  TQSequenceState state() const { return state_; }
  // Recent tokens (format().recent_tokens() > 0): device rows [n_q, kv_heads, head_dim] fp32 of
  // keys and values of the last n_q positions, appended through append() / append_device() since
  // the last attention over them (what attend() passes as QueryRows::k_new / v_new); the rows
  // appended so before them go into the ring first. Throws InvalidArgument when fewer were
  // appended that way. After it, the next host-path append puts these rows into the ring.
  std::pair<const float*, const float*> recent_input(int n_q) const;

  // Costly: the cache's contents as a CPU cache in the same state (a download).
  std::unique_ptr<KVCache> to_host() const;

 private:
  void release_blocks_before(int64_t first_needed);
  void release_all_blocks();
  void convert_to_staged_format();
  void check_copyable(const char* what) const;
  // The rows as a CPU cache of the current format (split orders set, no other state).
  std::unique_ptr<KVCache> download() const;
  void adopt_host_state();
  void upload_rows_of(const KVCache& host);
  // The state block of the current format (orders, means, sink rows, recent ring; none when it
  // has no such state) and state_'s sink and ring pointers.
  void reset_state_storage();
  void grow_blocks(int n);
  // The pending host-path rows but the last `keep` into the ring (as after the attention of a
  // sequence of size_ - keep tokens), then only those `keep` pending. Const: attend() folds
  // what its queries do not cover.
  void fold_recent(int64_t keep = 0) const;
  // The held recent rows [keys, values][kv_heads][n][head_dim] fp16 of positions size_ - n ..
  // size_ - 1, n = min(W - 1, size_ - sink tokens) (TurboQuantKVCache::set_recent_rows), and
  // back into the ring from a CPU cache's recent_view().
  std::vector<uint16_t> download_recent(int64_t* n) const;
  void upload_recent_of(const KVCache& host);
  void set_host_recent_rows(KVCache& cache) const;  // W > 1: download_recent() into it
  void drop_pending() const;
  void set_calibration(const std::vector<std::vector<int>>& key_orders,
                       const std::vector<std::vector<int>>& value_orders,
                       const std::vector<uint16_t>& key_means,
                       const std::vector<uint16_t>& value_means);
  void clear_calibration();

  DeviceCacheContext& context_;
  std::shared_ptr<const DeviceFormat> format_;
  int window_;
  std::shared_ptr<const DeviceFormat> staged_;  // until converted
  int64_t quantized_kv_start_ = 0;              // > 0: a staged cache
  int64_t generation_ = 0;
  int64_t size_ = 0;
  std::vector<uint8_t*> blocks_;  // nullptr: released (rotating) — reads go to the zero block
  bool calibrated_ = false;
  // An empty CPU cache of this configuration in this cache's state (what the calibration
  // tokens fixed): the source of write_state() and of the split channel orders.
  std::unique_ptr<KVCache> state_host_;
  std::vector<std::vector<int>> key_orders_, value_orders_;  // split codecs, once calibrated
  // Device copy of the orders and means, and the sink rows (a pool block; device_caches.cc
  // StateLayout).
  uint8_t* state_block_ = nullptr;
  size_t state_bytes_ = 0;
  TQSequenceState state_;
  // Recent tokens: the rows appended through the host path, not yet in the ring (positions
  // size_ - pending_rows_ .. size_ - 1), fp32 [pending_rows_, kv_heads, head_dim].
  mutable DeviceBuffer<float> pending_k_, pending_v_;
  mutable int64_t pending_rows_ = 0;
  mutable bool pending_attended_ = false;  // recent_input() read them
};

// The device caches of a plan (make_layer_caches's counterpart).
LayerCaches make_device_layer_caches(DeviceCacheContext& context,
                                     const std::vector<LayerCachePlan>& plan, DenseElem dense_elem,
                                     bool fused);

}  // namespace turbokv::cuda
