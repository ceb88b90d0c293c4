// Device KV caches (device_caches.h): the cache object, the shared context, and the plan ->
// caches factory. The formats are in device_formats.cc.
#include "kv/cuda/device_caches.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kv/byte_io.h"
#include "kv/cuda/device_formats.h"
#include "kv/turboquant_kv_cache.h"

namespace turbokv::cuda {
namespace {

int64_t blocks_for(int64_t tokens) { return (tokens + kBlockTokens - 1) / kBlockTokens; }

// A device copy of host data in the context's scratch, valid until the next scratch use.
template <typename T>
T* scratch_copy(DeviceCacheContext& context, const T* host, size_t count, size_t offset_bytes,
                void* base) {
  T* dst = reinterpret_cast<T*>(static_cast<uint8_t*>(base) + offset_bytes);
  TURBOKV_CUDA_CHECK(
      cudaMemcpyAsync(dst, host, count * sizeof(T), cudaMemcpyHostToDevice, context.stream()));
  return dst;
}

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// A cache's state block: [key order][value order] int [kv_heads, head_dim] and [key mean]
// [value mean] fp16 [kv_heads, head_dim] for a calibrating format, then [sink keys][sink
// values] fp16 [kv_heads, sink_tokens, head_dim], then the recent-token ring [keys][values]
// fp16 [kv_heads, recent_tokens - 1, head_dim]; each section 16-B aligned.
struct StateLayout {
  size_t key_order = 0, value_order = 0, key_mean = 0, value_mean = 0;
  size_t sink_keys = 0, sink_values = 0;
  size_t sink_bytes = 0;  // of each sink section
  size_t recent_keys = 0, recent_values = 0;
  size_t recent_bytes = 0;  // of each ring section
  size_t bytes = 0;
};

StateLayout state_layout(const DeviceFormat& f) {
  const size_t hd = size_t(f.kv_heads()) * size_t(f.head_dim());
  StateLayout l;
  auto take = [&](size_t bytes) {
    const size_t at = l.bytes;
    l.bytes = align16(l.bytes + bytes);
    return at;
  };
  if (f.calibrates()) {
    l.key_order = take(hd * sizeof(int));
    l.value_order = take(hd * sizeof(int));
    l.key_mean = take(hd * 2);
    l.value_mean = take(hd * 2);
  }
  if (f.sink_tokens() > 0) {
    l.sink_bytes = hd * size_t(f.sink_tokens()) * 2;
    l.sink_keys = take(l.sink_bytes);
    l.sink_values = take(l.sink_bytes);
  }
  if (f.recent_tokens() > 1) {
    l.recent_bytes = hd * size_t(f.recent_tokens() - 1) * 2;
    l.recent_keys = take(l.recent_bytes);
    l.recent_values = take(l.recent_bytes);
  }
  return l;
}

}  // namespace

// ----------------------------------------------------------------------------- context

DeviceCacheContext::DeviceCacheContext(size_t pool_bytes, cudaStream_t stream)
    : pool_(pool_bytes), stream_(stream) {}

DeviceCacheContext::~DeviceCacheContext() {
  if (scratch_ != nullptr) cudaFree(scratch_);
}

void* DeviceCacheContext::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_ != nullptr) {
      TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
      TURBOKV_CUDA_CHECK(cudaFree(scratch_));
      scratch_ = nullptr;
    }
    TURBOKV_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

std::shared_ptr<const DeviceFormat> DeviceCacheContext::format(const LayerCachePlan& plan,
                                                               DenseElem dense_elem, bool fused) {
  const std::string key = format_key(plan, dense_elem, fused);
  for (const auto& [k, f] : formats_) {
    if (k == key) return f;
  }
  std::shared_ptr<const DeviceFormat> f = make_device_format(plan, dense_elem, fused);
  formats_.emplace_back(key, f);
  return f;
}

// ----------------------------------------------------------------------------- shared rows

DeviceKVRows::DeviceKVRows(DeviceBlockPool& pool, std::shared_ptr<const DeviceFormat> format,
                           std::vector<uint8_t*> blocks, int64_t tokens)
    : pool_(pool), format_(std::move(format)), blocks_(std::move(blocks)), tokens_(tokens) {
  for (uint8_t* b : blocks_) pool_.retain(b);
}

DeviceKVRows::~DeviceKVRows() {
  for (uint8_t* b : blocks_) pool_.release(b, format_->block_bytes());
}

size_t DeviceKVRows::nbytes() const { return blocks_.size() * format_->block_bytes(); }

// ----------------------------------------------------------------------------- cache

DeviceKVCache::DeviceKVCache(DeviceCacheContext& context,
                             std::shared_ptr<const DeviceFormat> format, int window,
                             std::shared_ptr<const DeviceFormat> staged,
                             int64_t quantized_kv_start)
    : context_(context),
      format_(std::move(format)),
      window_(window),
      staged_(std::move(staged)),
      quantized_kv_start_(staged_ ? quantized_kv_start : 0) {
  if (window_ < 0) throw InvalidArgument(str_cat("sliding window ", window_, " must be >= 0"));
  if (staged_ && quantized_kv_start < 1) {
    throw InvalidArgument(str_cat("quantized_kv_start ", quantized_kv_start, " must be >= 1"));
  }
  // A conversion would have to rebuild the ring before the converting step's attention.
  if (staged_ && staged_->recent_tokens() > 1) {
    throw Unsupported(
        "--device cuda: kv_recent_tokens > 1 with --quantized-kv-start is not supported on the "
        "CUDA backend; use --device cpu, or kv_recent_tokens 0 or 1");
  }
  if (window_ == 0) state_host_ = format_->host_cache();
  reset_state_storage();
}

DeviceKVCache::~DeviceKVCache() {
  release_all_blocks();
  if (state_block_ != nullptr) context_.pool().release(state_block_, state_bytes_);
}

void DeviceKVCache::release_all_blocks() {
  for (uint8_t* b : blocks_) {
    if (b != nullptr) context_.pool().release(b, format_->block_bytes());
  }
  blocks_.clear();
}

void DeviceKVCache::convert_to_staged_format() {
  std::unique_ptr<KVCache> host = download();  // the dense history, as f16/bf16/f32 values
  const auto& dense = dynamic_cast<const DenseKVCache&>(*host);
  std::vector<float> k, v;
  dense.copy_tokens(0, dense.size(), &k, &v);
  const int n = int(dense.size());
  release_all_blocks();
  drop_pending();
  size_ = 0;
  format_ = std::move(staged_);
  staged_.reset();
  state_host_ = format_->host_cache();
  clear_calibration();
  reset_state_storage();
  ++generation_;
  append(k.data(), v.data(), n);  // calibrates on the whole history, as convert_from does
}

std::string DeviceKVCache::type_name() const {
  return window_ > 0 ? "rotating" : format_->type_name();
}

size_t DeviceKVCache::nbytes() const {
  if (window_ > 0) return size_t(std::min<int64_t>(size_, window_)) * format_->bytes_per_token();
  return format_->nbytes(size_, calibrated_);
}

const uint8_t* DeviceKVCache::zero_block() const {
  return context_.pool().zero_block(format_->block_bytes());
}

void DeviceKVCache::reserve_tokens(int n) {
  if (n < 0) throw InvalidArgument(str_cat("reserve_tokens(", n, ")"));
  fold_recent();
  grow_blocks(n);
}

void DeviceKVCache::grow_blocks(int n) {
  const int64_t need = blocks_for(size_ + n);
  while (int64_t(blocks_.size()) < need) {
    blocks_.push_back(context_.pool().allocate(format_->block_bytes()));
  }
}

void DeviceKVCache::release_blocks_before(int64_t first_needed) {
  const int64_t first_block = first_needed / kBlockTokens;
  for (int64_t i = 0; i < first_block && i < int64_t(blocks_.size()); ++i) {
    if (blocks_[size_t(i)] != nullptr) {
      context_.pool().release(blocks_[size_t(i)], format_->block_bytes());
      blocks_[size_t(i)] = nullptr;
    }
  }
}

void DeviceKVCache::advance(int n) {
  size_ += n;
  // A future query at p >= size_ sees keys > p - W >= size_ - W.
  if (window_ > 0) release_blocks_before(std::max<int64_t>(0, size_ - window_));
  if (staged_ && size_ >= quantized_kv_start_) convert_to_staged_format();
}

void DeviceKVCache::reset_state_storage() {
  if (state_block_ != nullptr) {
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));  // no kernel reads it now
    context_.pool().release(state_block_, state_bytes_);
    state_block_ = nullptr;
    state_bytes_ = 0;
  }
  state_ = TQSequenceState{};
  const StateLayout l = state_layout(*format_);
  if (l.bytes == 0) return;
  if (l.bytes > DeviceBlockPool::kChunkBytes) {
    throw Unsupported(str_cat(
        "--device cuda: ", format_->sink_tokens(), " sink tokens and ", format_->recent_tokens(),
        " recent tokens of ", kv_heads(), " KV heads x ", head_dim(), " need ", l.bytes,
        " B of state per sequence and layer, more than the ", DeviceBlockPool::kChunkBytes >> 20,
        " MiB the GPU pool gives one allocation; use fewer sink or recent tokens"));
  }
  state_bytes_ = l.bytes;
  state_block_ = context_.pool().allocate(state_bytes_);
  if (l.sink_bytes > 0) {
    state_.sink_keys = reinterpret_cast<__half*>(state_block_ + l.sink_keys);
    state_.sink_values = reinterpret_cast<__half*>(state_block_ + l.sink_values);
  }
  if (l.recent_bytes > 0) {
    state_.recent_keys = reinterpret_cast<__half*>(state_block_ + l.recent_keys);
    state_.recent_values = reinterpret_cast<__half*>(state_block_ + l.recent_values);
  }
}

void DeviceKVCache::drop_pending() const {
  pending_k_ = DeviceBuffer<float>();
  pending_v_ = DeviceBuffer<float>();
  pending_rows_ = 0;
  pending_attended_ = false;
}

void DeviceKVCache::fold_recent(int64_t keep) const {
  keep = std::clamp<int64_t>(keep, 0, pending_rows_);
  const int64_t folded = pending_rows_ - keep;
  if (folded > 0 && format_->recent_tokens() > 1) {
    // The folded rows as the queries of one sequence of length size_ - keep: the update
    // kernel's input as after the attention of a step.
    const size_t table_entries = std::max<size_t>(1, size_t(blocks_for(size_)));
    const size_t off_len = align16(table_entries * 8), off_qs = off_len + 16;
    const size_t off_state = off_qs + 16;
    void* base = context_.scratch(off_state + align16(sizeof(TQSequenceState)));
    std::vector<const uint8_t*> table(table_entries, zero_block());
    const int len = int(size_ - keep);
    const int q_start[2] = {0, int(folded)};
    const TQSequenceState st = state_;
    PagedBatch batch;
    batch.block_table = scratch_copy(context_, table.data(), table.size(), 0, base);
    batch.table_stride = int(table_entries);
    batch.seq_len = scratch_copy(context_, &len, 1, off_len, base);
    batch.batch = 1;
    batch.max_len = len;
    QueryRows q;
    q.q_start = scratch_copy(context_, q_start, 2, off_qs, base);
    q.max_n_q = int(folded);
    q.k_new = pending_k_.data();
    q.v_new = pending_v_.data();
    format_->update_recent(batch, scratch_copy(context_, &st, 1, off_state, base), q,
                           context_.stream());
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
  }
  if (keep == 0 || folded == 0) {
    if (keep == 0) drop_pending();
    return;
  }
  const size_t row = size_t(kv_heads()) * head_dim(), count = size_t(keep) * row;
  DeviceBuffer<float> pk(count), pv(count);
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(pk.data(), pending_k_.data() + size_t(folded) * row, count * 4,
                                     cudaMemcpyDeviceToDevice, context_.stream()));
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(pv.data(), pending_v_.data() + size_t(folded) * row, count * 4,
                                     cudaMemcpyDeviceToDevice, context_.stream()));
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
  pending_k_ = std::move(pk);
  pending_v_ = std::move(pv);
  pending_rows_ = keep;
}

std::pair<const float*, const float*> DeviceKVCache::recent_input(int n_q) const {
  if (format_->recent_tokens() == 0 || n_q <= 0) return {nullptr, nullptr};
  if (n_q > pending_rows_) {
    throw InvalidArgument(str_cat("attend: ", n_q, " queries on a GPU cache with recent tokens, ",
                                  "but ", pending_rows_,
                                  " tokens were appended since its last attention"));
  }
  // Rows before the queries' are read from the ring, as the kernels read them.
  if (n_q < pending_rows_) fold_recent(n_q);
  pending_attended_ = true;
  return {pending_k_.data(), pending_v_.data()};
}

std::vector<uint16_t> DeviceKVCache::download_recent(int64_t* n_out) const {
  const int W = format_->recent_tokens();
  const int64_t coded = size_ - std::min<int64_t>(size_, format_->sink_tokens());
  const int64_t n = std::min<int64_t>(W - 1, coded);
  *n_out = n;
  const int heads = kv_heads(), d = head_dim();
  const size_t row = size_t(heads) * d;
  std::vector<uint16_t> rows(2 * row * size_t(n));
  if (n == 0) return rows;
  const StateLayout l = state_layout(*format_);
  const int ring = W - 1;
  std::vector<uint16_t> rk(l.recent_bytes / 2), rv(rk.size());
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(rk.data(), state_block_ + l.recent_keys, l.recent_bytes,
                                     cudaMemcpyDeviceToHost, context_.stream()));
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(rv.data(), state_block_ + l.recent_values, l.recent_bytes,
                                     cudaMemcpyDeviceToHost, context_.stream()));
  const int64_t from_pending = std::min<int64_t>(n, pending_rows_);
  std::vector<float> pk(size_t(from_pending) * row), pv(pk.size());
  if (from_pending > 0) {
    const size_t first = size_t(pending_rows_ - from_pending) * row;
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(pk.data(), pending_k_.data() + first, pk.size() * 4,
                                       cudaMemcpyDeviceToHost, context_.stream()));
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(pv.data(), pending_v_.data() + first, pv.size() * 4,
                                       cudaMemcpyDeviceToHost, context_.stream()));
  }
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = size_ - n + t;
    const int64_t pending_row = p - (size_ - from_pending);  // >= 0: a pending row
    for (int h = 0; h < heads; ++h) {
      uint16_t* k = &rows[(size_t(h) * n + t) * d];
      uint16_t* v = k + row * size_t(n);
      for (int j = 0; j < d; ++j) {
        if (pending_row >= 0) {
          const size_t src = (size_t(pending_row) * heads + h) * d + j;
          k[j] = f32_to_f16(pk[src]);
          v[j] = f32_to_f16(pv[src]);
        } else {
          const size_t src = (size_t(h) * ring + size_t(p % ring)) * d + j;
          k[j] = rk[src];
          v[j] = rv[src];
        }
      }
    }
  }
  return rows;
}

void DeviceKVCache::upload_recent_of(const KVCache& host) {
  drop_pending();
  const int W = format_->recent_tokens();
  if (W <= 1) return;
  const auto* tq = dynamic_cast<const TurboQuantKVCache*>(&host);
  if (tq == nullptr) throw FormatError("recent rows from a cache that is not TurboQuant");
  const DenseKVView view = tq->recent_view();
  const int64_t size = host.size();
  const int64_t first = std::max<int64_t>(format_->sink_tokens(), size - (W - 1));
  if (first >= size) return;
  if (view.dtype != KVDType::kF16 || view.first_pos > first ||
      view.first_pos + view.n_tokens < size) {
    throw FormatError(str_cat("the CPU cache holds recent rows of positions ", view.first_pos,
                              " .. ", view.first_pos + view.n_tokens - 1, ", the GPU cache needs ",
                              first, " .. ", size - 1));
  }
  const int heads = kv_heads(), d = head_dim(), ring = W - 1;
  const StateLayout l = state_layout(*format_);
  std::vector<uint16_t> rk(l.recent_bytes / 2, 0), rv(rk.size(), 0);
  for (int64_t p = first; p < size; ++p) {
    for (int h = 0; h < heads; ++h) {
      const size_t src = (size_t(h) * view.head_stride + size_t(p - view.first_pos)) * d;
      const size_t dst = (size_t(h) * ring + size_t(p % ring)) * d;
      std::memcpy(&rk[dst], static_cast<const uint16_t*>(view.k) + src, 2 * size_t(d));
      std::memcpy(&rv[dst], static_cast<const uint16_t*>(view.v) + src, 2 * size_t(d));
    }
  }
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(state_block_ + l.recent_keys, rk.data(), l.recent_bytes,
                                     cudaMemcpyHostToDevice, context_.stream()));
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(state_block_ + l.recent_values, rv.data(), l.recent_bytes,
                                     cudaMemcpyHostToDevice, context_.stream()));
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

size_t DeviceKVCache::state_block_bytes(const DeviceFormat& f) {
  return state_layout(f).bytes;
}

void DeviceKVCache::clear_calibration() {
  calibrated_ = false;
  key_orders_.clear();
  value_orders_.clear();
  state_.key_order = state_.value_order = nullptr;
  state_.key_mean = state_.value_mean = nullptr;
}

void DeviceKVCache::set_calibration(const std::vector<std::vector<int>>& key_orders,
                                    const std::vector<std::vector<int>>& value_orders,
                                    const std::vector<uint16_t>& key_means,
                                    const std::vector<uint16_t>& value_means) {
  clear_calibration();
  const int heads = kv_heads(), d = head_dim();
  const size_t hd = size_t(heads) * d;
  const StateLayout l = state_layout(*format_);
  for (const auto* orders : {&key_orders, &value_orders}) {
    if (!orders->empty() && orders->size() != size_t(heads)) {
      throw FormatError("split channel orders for the wrong number of KV heads");
    }
    for (const auto& o : *orders) {
      if (int(o.size()) != d) throw FormatError("split channel order of the wrong length");
    }
  }
  for (const auto* mean : {&key_means, &value_means}) {
    if (!mean->empty() && mean->size() != hd) throw FormatError("mean of the wrong length");
  }
  const bool any =
      !key_orders.empty() || !value_orders.empty() || !key_means.empty() || !value_means.empty();
  if (any && (state_block_ == nullptr || !format_->calibrates())) {
    throw FormatError("calibration state for a GPU cache format that has none");
  }
  auto upload = [&](size_t offset, const void* data, size_t bytes) {
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(state_block_ + offset, data, bytes, cudaMemcpyHostToDevice,
                                       context_.stream()));
  };
  std::vector<int> k_host, v_host;  // [kv_heads, head_dim]
  for (const auto& o : key_orders) k_host.insert(k_host.end(), o.begin(), o.end());
  for (const auto& o : value_orders) v_host.insert(v_host.end(), o.begin(), o.end());
  if (!k_host.empty()) {
    upload(l.key_order, k_host.data(), k_host.size() * sizeof(int));
    state_.key_order = reinterpret_cast<const int*>(state_block_ + l.key_order);
  }
  if (!v_host.empty()) {
    upload(l.value_order, v_host.data(), v_host.size() * sizeof(int));
    state_.value_order = reinterpret_cast<const int*>(state_block_ + l.value_order);
  }
  if (!key_means.empty()) {
    upload(l.key_mean, key_means.data(), hd * 2);
    state_.key_mean = reinterpret_cast<const __half*>(state_block_ + l.key_mean);
  }
  if (!value_means.empty()) {
    upload(l.value_mean, value_means.data(), hd * 2);
    state_.value_mean = reinterpret_cast<const __half*>(state_block_ + l.value_mean);
  }
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));  // host may go away
  key_orders_ = key_orders;
  value_orders_ = value_orders;
  calibrated_ = true;
}

void DeviceKVCache::calibrate(const float* k, const float* v, int n) {
  if (!needs_calibration() || n <= 0) return;
  const size_t row = size_t(kv_heads()) * head_dim();
  const size_t count = size_t(n) * row;
  std::vector<float> hk(count), hv(count);
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(hk.data(), k, count * sizeof(float), cudaMemcpyDeviceToHost,
                                     context_.stream()));
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(hv.data(), v, count * sizeof(float), cudaMemcpyDeviceToHost,
                                     context_.stream()));
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
  // The CPU cache fixes its state from the same chunk with the same code (without coding the
  // rows, which the device holds); take the orders and means from it.
  state_host_ = format_->host_cache();
  if (auto* tq = dynamic_cast<TurboQuantKVCache*>(state_host_.get())) {
    tq->calibrate_from(hk.data(), hv.data(), n, size_);
  } else {
    state_host_->append(hk.data(), hv.data(), n);
    state_host_->trim(n);
  }
  adopt_host_state();
}

void DeviceKVCache::adopt_host_state() {
  const auto* tq = dynamic_cast<const TurboQuantKVCache*>(state_host_.get());
  if (tq != nullptr && format_->calibrates() && tq->calibrated()) {
    set_calibration(tq->key_channel_orders(), tq->value_channel_orders(), tq->key_means(),
                    tq->value_means());
    return;
  }
  clear_calibration();
}

std::shared_ptr<const KVRows> DeviceKVCache::copy_rows(int64_t first, int64_t n) const {
  check_rows(first, n);
  // Sink rows live outside the blocks: rows that include them are copied.
  // So do the rows of a cache with a recent-token ring (its rows live outside the blocks too).
  if (window_ == 0 && quantized_kv_start_ == 0 && n > 0 && first % kBlockTokens == 0 &&
      n % kBlockTokens == 0 && first >= format_->sink_tokens() && format_->recent_tokens() <= 1) {
    std::vector<uint8_t*> shared(blocks_.begin() + first / kBlockTokens,
                                 blocks_.begin() + (first + n) / kBlockTokens);
    return std::make_shared<const DeviceKVRows>(context_.pool(), format_, std::move(shared), n);
  }
  return KVCache::copy_rows(first, n);
}

void DeviceKVCache::append_rows(const KVRows& rows) {
  const auto* device = dynamic_cast<const DeviceKVRows*>(&rows);
  if (device == nullptr || device->format() != format_.get() || size_ % kBlockTokens != 0 ||
      window_ > 0 || size_ < format_->sink_tokens() || format_->recent_tokens() > 1) {
    KVCache::append_rows(rows);
    return;
  }
  fold_recent();
  // Blocks reserved past the tokens held give way to the shared ones.
  while (int64_t(blocks_.size()) > size_ / kBlockTokens) {
    context_.pool().release(blocks_.back(), format_->block_bytes());
    blocks_.pop_back();
  }
  for (uint8_t* b : device->blocks()) {
    context_.pool().retain(b);
    blocks_.push_back(b);
  }
  size_ += device->tokens();
}

void DeviceKVCache::trim(int64_t n) {
  if (n < 0 || n > size_) {
    throw InvalidArgument(str_cat("trim(", n, ") on a cache of ", size_, " tokens"));
  }
  // As the CPU cache: a ring holds no shorter cache's last rows.
  const int64_t coded = size_ - std::min<int64_t>(size_, format_->sink_tokens());
  if (std::min(n, coded) > 0 && format_->recent_tokens() > 1) {
    throw Unsupported(str_cat("trim(", n, "): a cache with ", format_->recent_tokens(),
                              " recent tokens no longer holds the rows a shorter cache needs"));
  }
  pending_rows_ = std::max<int64_t>(0, pending_rows_ - n);
  if (window_ > 0 && n > 0) {
    const int64_t first_held = blocks_.empty() ? 0 : [&] {
      int64_t i = 0;
      while (i < int64_t(blocks_.size()) && blocks_[size_t(i)] == nullptr) ++i;
      return i * kBlockTokens;
    }();
    if (size_ - n - (window_ - 1) < first_held && first_held > 0) {
      throw Unsupported(str_cat("trim(", n, "): the sliding-window cache no longer holds the ",
                                "tokens the window would need after it"));
    }
  }
  size_ -= n;
  const int64_t keep = blocks_for(size_);
  while (int64_t(blocks_.size()) > keep) {
    if (blocks_.back() != nullptr) context_.pool().release(blocks_.back(), format_->block_bytes());
    blocks_.pop_back();
  }
  // The next append writes into the last block: a shared one is copied first.
  if (size_ % kBlockTokens != 0 && !blocks_.empty() && blocks_.back() != nullptr &&
      context_.pool().references(blocks_.back()) > 1) {
    uint8_t* own = context_.pool().allocate(format_->block_bytes());
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(own, blocks_.back(), format_->block_bytes(),
                                       cudaMemcpyDeviceToDevice, context_.stream()));
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    context_.pool().release(blocks_.back(), format_->block_bytes());
    blocks_.back() = own;
  }
}

void DeviceKVCache::append(const float* k, const float* v, int n_tokens) {
  check_append(k, v, n_tokens);
  if (n_tokens == 0) return;
  const size_t count = size_t(n_tokens) * kv_heads() * head_dim();
  DeviceBuffer<float> dk(count), dv(count);
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(dk.data(), k, count * sizeof(float), cudaMemcpyHostToDevice,
                                     context_.stream()));
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(dv.data(), v, count * sizeof(float), cudaMemcpyHostToDevice,
                                     context_.stream()));
  append_device(dk.data(), dv.data(), n_tokens);
}

void DeviceKVCache::append_device(const float* k, const float* v, int n_tokens) {
  if (n_tokens < 0 || (n_tokens > 0 && (k == nullptr || v == nullptr))) {
    throw InvalidArgument(str_cat("append_device: ", n_tokens, " tokens without data"));
  }
  if (n_tokens == 0) return;
  if (pending_attended_) fold_recent();
  grow_blocks(n_tokens);
  // Scratch: [row_seq][row_pos][table][seq_len][state]
  const size_t table_entries = blocks_.size();
  const size_t off_pos = align16(size_t(n_tokens) * 4);
  const size_t off_table = off_pos + align16(size_t(n_tokens) * 4);
  const size_t off_len = off_table + align16(table_entries * 8);
  const size_t off_state = off_len + 16;
  void* base = context_.scratch(off_state + align16(sizeof(TQSequenceState)));
  std::vector<int> seq(static_cast<size_t>(n_tokens), 0);
  std::vector<int> pos(static_cast<size_t>(n_tokens));
  for (int i = 0; i < n_tokens; ++i) pos[size_t(i)] = int(size_ + i);
  std::vector<uint8_t*> table(table_entries);
  for (size_t i = 0; i < table_entries; ++i) {
    table[i] = blocks_[i] != nullptr ? blocks_[i] : const_cast<uint8_t*>(zero_block());
  }
  const int len = int(size_ + n_tokens);
  AppendRows rows;
  rows.k = k;
  rows.v = v;
  rows.row_seq = scratch_copy(context_, seq.data(), seq.size(), 0, base);
  rows.row_pos = scratch_copy(context_, pos.data(), pos.size(), off_pos, base);
  rows.rows = n_tokens;
  PagedBatch batch;
  batch.block_table = scratch_copy(context_, table.data(), table.size(), off_table, base);
  batch.table_stride = int(table_entries);
  batch.seq_len = scratch_copy(context_, &len, 1, off_len, base);
  batch.batch = 1;
  batch.max_len = len;
  calibrate(k, v, n_tokens);
  const TQSequenceState st = state_;
  const TQSequenceState* states = scratch_copy(context_, &st, 1, off_state, base);
  format_->append(batch, states, rows, context_.stream());
  if (format_->recent_tokens() > 0) {  // the rows' fp32 copy: attend() reads them as k_new
    const size_t row = size_t(kv_heads()) * head_dim();
    const size_t held = size_t(pending_rows_) * row, added = size_t(n_tokens) * row;
    DeviceBuffer<float> pk(held + added), pv(held + added);
    for (auto [dst, old, src] : {std::tuple{pk.data(), pending_k_.data(), k},
                                 std::tuple{pv.data(), pending_v_.data(), v}}) {
      if (held > 0) {
        TURBOKV_CUDA_CHECK(
            cudaMemcpyAsync(dst, old, held * 4, cudaMemcpyDeviceToDevice, context_.stream()));
      }
      TURBOKV_CUDA_CHECK(
          cudaMemcpyAsync(dst + held, src, added * 4, cudaMemcpyDeviceToDevice, context_.stream()));
    }
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    pending_k_ = std::move(pk);
    pending_v_ = std::move(pv);
    pending_rows_ += n_tokens;
  }
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
  advance(n_tokens);
}

void DeviceKVCache::attend(const float* q, int n_q, const AttentionParams& params,
                           float* out) const {
  check_attend(q, n_q, params, out);
  if (window_ > 0 && params.sliding_window != 0 && params.sliding_window != window_) {
    throw InvalidArgument(str_cat("attend: sliding window ", params.sliding_window,
                                  " differs from the cache's ", window_));
  }
  const int d = head_dim();
  const size_t count = size_t(n_q) * params.n_heads * d;
  const size_t table_entries = std::max<size_t>(1, blocks_.size());
  std::vector<uint8_t*> table(table_entries, const_cast<uint8_t*>(zero_block()));
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (blocks_[i] != nullptr) table[i] = blocks_[i];
  }
  const int len = int(size_);
  const int q_start[2] = {0, n_q};
  AttentionOptions o;
  o.n_heads = params.n_heads;
  o.scale = params.scale;
  o.logit_softcap = params.logit_softcap;
  o.sliding_window = window_ > 0 ? window_ : params.sliding_window;
  PagedBatch batch;
  batch.table_stride = int(table_entries);
  batch.batch = 1;
  batch.max_len = len;
  QueryRows rows;
  rows.max_n_q = n_q;
  // Before the scratch is filled: putting earlier rows into the ring uses it.
  std::tie(rows.k_new, rows.v_new) = recent_input(n_q);
  // Scratch: [q][out][table][seq_len][q_start][state][workspace]
  const size_t off_out = align16(count * 4), off_table = off_out + align16(count * 4);
  const size_t off_len = off_table + align16(table_entries * 8), off_qs = off_len + 16;
  const size_t off_state = off_qs + 16, off_ws = off_state + align16(sizeof(TQSequenceState));
  // Workspace size first (it depends only on shapes).
  const size_t ws_bytes = format_->workspace_bytes(batch, rows, o);
  void* base = context_.scratch(off_ws + ws_bytes);
  rows.q = scratch_copy(context_, q, count, 0, base);
  rows.out = reinterpret_cast<float*>(static_cast<uint8_t*>(base) + off_out);
  batch.block_table = scratch_copy(context_, table.data(), table.size(), off_table, base);
  batch.seq_len = scratch_copy(context_, &len, 1, off_len, base);
  rows.q_start = scratch_copy(context_, q_start, 2, off_qs, base);
  const TQSequenceState st = state_;
  const TQSequenceState* states = scratch_copy(context_, &st, 1, off_state, base);
  uint8_t* ws = static_cast<uint8_t*>(base) + off_ws;
  if (format_->zeroed_workspace()) {
    TURBOKV_CUDA_CHECK(cudaMemsetAsync(ws, 0, ws_bytes, context_.stream()));
  }
  format_->attend(batch, states, rows, o, n_q, ws, ws_bytes, context_.stream());
  TURBOKV_CUDA_CHECK(cudaMemcpyAsync(out, rows.out, count * sizeof(float), cudaMemcpyDeviceToHost,
                                     context_.stream()));
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

std::unique_ptr<KVCache> DeviceKVCache::download() const {
  const size_t bb = format_->block_bytes();
  std::vector<uint8_t> host(blocks_.size() * bb);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(host.data() + i * bb, blocks_[i], bb,
                                       cudaMemcpyDeviceToHost, context_.stream()));
  }
  std::vector<uint16_t> sinks;
  const StateLayout l = state_layout(*format_);
  if (l.sink_bytes > 0) {
    sinks.resize(l.sink_bytes);  // two sections of sink_bytes / 2 halves each
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(sinks.data(), state_block_ + l.sink_keys, l.sink_bytes,
                                       cudaMemcpyDeviceToHost, context_.stream()));
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(sinks.data() + l.sink_bytes / 2,
                                       state_block_ + l.sink_values, l.sink_bytes,
                                       cudaMemcpyDeviceToHost, context_.stream()));
  }
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
  std::unique_ptr<KVCache> cache = format_->to_host(host, size_, key_orders_, value_orders_, sinks);
  set_host_recent_rows(*cache);
  return cache;
}

void DeviceKVCache::set_host_recent_rows(KVCache& cache) const {
  if (format_->recent_tokens() <= 1) return;
  int64_t n = 0;
  const std::vector<uint16_t> rows = download_recent(&n);
  dynamic_cast<TurboQuantKVCache&>(cache).set_recent_rows(rows, n);
}

std::unique_ptr<KVCache> DeviceKVCache::to_host() const {
  check_copyable("copied to the host");
  std::unique_ptr<KVCache> cache = download();
  // Carry the state the calibration tokens fixed (the rows stay): a state round trip.
  ByteWriter rows;
  cache->write_rows(rows, 0, size_);
  ByteWriter state;
  state_host_->write_state(state);
  ByteReader state_in(state.buffer().data(), state.buffer().size());
  cache->read_state(state_in);
  ByteReader rows_in(rows.buffer().data(), rows.buffer().size());
  cache->read_rows(rows_in, size_);
  set_host_recent_rows(*cache);
  return cache;
}

void DeviceKVCache::check_copyable(const char* what) const {
  if (window_ > 0) {
    throw Unsupported(str_cat("a sliding-window layer's GPU cache cannot be ", what));
  }
  if (quantized_kv_start_ > 0) {
    throw Unsupported(str_cat("a --quantized-kv-start GPU cache cannot be ", what));
  }
}

int64_t DeviceKVCache::calibration_tokens() const {
  if (quantized_kv_start_ > 0) return staged_ ? 0 : quantized_kv_start_;
  return state_host_ != nullptr ? state_host_->calibration_tokens() : 0;
}

void DeviceKVCache::write_state(ByteWriter& out) const {
  check_copyable("saved or copied");
  state_host_->write_state(out);
}

void DeviceKVCache::read_state(ByteReader& in) {
  check_copyable("loaded or restored");
  state_host_->read_state(in);  // checks the configuration, then holds the recorded state
  release_all_blocks();
  drop_pending();
  size_ = 0;
  adopt_host_state();
}

void DeviceKVCache::write_rows(ByteWriter& out, int64_t first, int64_t n) const {
  check_copyable("saved or copied");
  check_rows(first, n);
  to_host()->write_rows(out, first, n);
}

void DeviceKVCache::upload_rows_of(const KVCache& host) {
  const std::vector<uint8_t> blocks = format_->from_host(host);
  release_all_blocks();
  drop_pending();
  size_ = 0;
  grow_blocks(int(host.size()));
  const size_t bb = format_->block_bytes();
  for (size_t i = 0; i < blocks.size() / bb; ++i) {
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(blocks_[i], blocks.data() + i * bb, bb,
                                       cudaMemcpyHostToDevice, context_.stream()));
  }
  const std::vector<uint16_t> sinks = format_->sinks_from_host(host);
  const StateLayout l = state_layout(*format_);
  if (!sinks.empty()) {
    if (sinks.size() * 2 != 2 * l.sink_bytes) throw FormatError("sink rows of the wrong size");
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(state_block_ + l.sink_keys, sinks.data(), l.sink_bytes,
                                       cudaMemcpyHostToDevice, context_.stream()));
    TURBOKV_CUDA_CHECK(cudaMemcpyAsync(state_block_ + l.sink_values,
                                       sinks.data() + l.sink_bytes / 2, l.sink_bytes,
                                       cudaMemcpyHostToDevice, context_.stream()));
  }
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
  size_ = host.size();
  upload_recent_of(host);
}

void DeviceKVCache::read_rows(ByteReader& in, int64_t n) {
  check_copyable("loaded or restored");
  // The rows are appended to a CPU copy of this cache, and the whole cache goes back up.
  std::unique_ptr<KVCache> host = to_host();
  host->read_rows(in, n);
  upload_rows_of(*host);
}

// ----------------------------------------------------------------------------- factory

LayerCaches make_device_layer_caches(DeviceCacheContext& context,
                                     const std::vector<LayerCachePlan>& plan, DenseElem dense_elem,
                                     bool fused) {
  LayerCaches caches;
  caches.reserve(plan.size());
  for (const LayerCachePlan& p : plan) {
    const bool staged = p.quantized_kv_start > 0 && (p.kind == LayerCacheKind::kTurboQuant ||
                                                     p.kind == LayerCacheKind::kUniform);
    if (staged) {
      LayerCachePlan dense = p;
      dense.kind = LayerCacheKind::kDense;
      caches.push_back(std::make_unique<DeviceKVCache>(
          context, context.format(dense, dense_elem, fused), 0,
          context.format(p, dense_elem, fused), p.quantized_kv_start));
      continue;
    }
    caches.push_back(std::make_unique<DeviceKVCache>(context, context.format(p, dense_elem, fused),
                                                     p.kind == LayerCacheKind::kRotating
                                                         ? p.window
                                                         : 0));
  }
  return caches;
}

}  // namespace turbokv::cuda
