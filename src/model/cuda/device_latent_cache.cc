// DeviceLatentCache (device_latent_cache.h).
#include "model/cuda/device_latent_cache.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/latent_attention.h"

namespace turbokv::cuda {
namespace {

// Runs `attend(i0, n, len)` over groups of a prefill's queries small enough that their scores fit
// a bounded workspace (64 Mi floats), growing `workspace` first. Query i0 + j of a group attends
// the first len - n + 1 + j tokens: the group's queries are the last n of a cache cut after its
// last query.
template <typename Attend>
void for_each_query_group(int n_q, int n_heads, int64_t size, DeviceBuffer<float>& workspace,
                          cudaStream_t stream, const Attend& attend) {
  constexpr int64_t kMaxWorkspace = int64_t(64) << 20;
  const int group = int(std::clamp<int64_t>(kMaxWorkspace / (int64_t(n_heads) * size), 1, n_q));
  const int64_t floats = latent_attention_workspace_floats(group, n_heads, size);
  if (size_t(floats) > workspace.size()) {
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    workspace = DeviceBuffer<float>(size_t(floats));
  }
  for (int i0 = 0; i0 < n_q; i0 += group) {
    const int n = std::min(group, n_q - i0);
    attend(i0, n, size - (n_q - (i0 + n)));
  }
}

}  // namespace

DeviceLatentCache::DeviceLatentCache(int dim, DenseElem elem, cudaStream_t stream)
    : dim_(dim), dense_(elem), stream_(stream) {
  if (dim < 1 || dim > 4096) {
    throw InvalidArgument(str_cat("latent cache rows of ", dim, " dims (1..4096)"));
  }
  elem_ = elem == DenseElem::kF32 ? Elem::kF32 : elem == DenseElem::kF16 ? Elem::kF16 : Elem::kBF16;
}

std::string DeviceLatentCache::type_name() const {
  return dense_ == DenseElem::kF32   ? "dense-f32"
         : dense_ == DenseElem::kF16 ? "dense-f16"
                                     : "dense-bf16";
}

void DeviceLatentCache::append_device(const float* rows, int n) {
  if (n < 0 || (n > 0 && rows == nullptr)) {
    throw InvalidArgument(str_cat("latent cache: append of ", n, " rows without data"));
  }
  if (n == 0) return;
  const size_t row_bytes = size_t(dim_) * elem_bytes(elem_);
  const size_t need = size_t(size_ + n) * row_bytes;
  if (need > rows_.size()) {
    DeviceBuffer<uint8_t> grown(std::max(need, 2 * rows_.size()));
    if (size_ > 0) {
      TURBOKV_CUDA_CHECK(cudaMemcpyAsync(grown.data(), rows_.data(), size_t(size_) * row_bytes,
                                         cudaMemcpyDeviceToDevice, stream_));
    }
    TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffer goes now
    rows_ = std::move(grown);
  }
  cast(rows, int64_t(n) * dim_, rows_.data() + size_t(size_) * row_bytes, elem_, stream_);
  size_ += n;
}

void DeviceLatentCache::append(const float* k, const float* v, int n_tokens) {
  check_append(k, v, n_tokens);
  if (n_tokens == 0) return;
  const size_t count = size_t(n_tokens) * size_t(dim_);
  if (std::memcmp(k, v, count * sizeof(float)) != 0) {
    throw InvalidArgument("latent cache: the values must be the latent rows themselves");
  }
  DeviceBuffer<float> d = DeviceBuffer<float>::upload(std::vector<float>(k, k + count));
  append_device(d.data(), n_tokens);
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceLatentCache::trim(int64_t n) {
  if (n < 0 || n > size_) {
    throw InvalidArgument(str_cat("trim(", n, ") of a cache of ", size_, " tokens"));
  }
  size_ -= n;
}

void DeviceLatentCache::attend_device(const float* q, int n_q, int n_heads, float scale,
                                      float* out) const {
  if (n_q < 1 || n_q > size_) {
    throw InvalidArgument(str_cat("latent cache: ", n_q, " queries over ", size_, " tokens"));
  }
  for_each_query_group(n_q, n_heads, size_, workspace_, stream_, [&](int i0, int n, int64_t len) {
    const size_t at = size_t(i0) * n_heads * dim_;
    latent_attention(rows_.data(), elem_, len, dim_, q + at, n, n_heads, scale, workspace_.data(),
                     out + at, stream_);
  });
}

void DeviceLatentCache::attend(const float* q, int n_q, const AttentionParams& params,
                               float* out) const {
  check_attend(q, n_q, params, out);
  if (params.logit_softcap != 0 || params.sliding_window != 0) {
    throw InvalidArgument("latent cache: attention without soft-capping or a sliding window");
  }
  const size_t count = size_t(n_q) * params.n_heads * dim_;
  DeviceBuffer<float> dq = DeviceBuffer<float>::upload(std::vector<float>(q, q + count));
  DeviceBuffer<float> dout(count);
  attend_device(dq.data(), n_q, params.n_heads, params.scale, dout.data());
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> host = dout.download();
  std::copy(host.begin(), host.end(), out);
}

namespace {

Elem elem_of(DenseElem e) {
  return e == DenseElem::kF32 ? Elem::kF32 : e == DenseElem::kF16 ? Elem::kF16 : Elem::kBF16;
}

const char* dense_name(DenseElem e) {
  return e == DenseElem::kF32 ? "dense-f32" : e == DenseElem::kF16 ? "dense-f16" : "dense-bf16";
}

// Grows buf (bytes) to hold `need` bytes, keeping its first `keep` bytes.
void grow(DeviceBuffer<uint8_t>& buf, size_t need, size_t keep, cudaStream_t stream) {
  if (need <= buf.size()) return;
  DeviceBuffer<uint8_t> grown(std::max(need, 2 * buf.size()));
  if (keep > 0) {
    TURBOKV_CUDA_CHECK(
        cudaMemcpyAsync(grown.data(), buf.data(), keep, cudaMemcpyDeviceToDevice, stream));
  }
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old buffer goes now
  buf = std::move(grown);
}

}  // namespace

DeviceWideKVCache::DeviceWideKVCache(int kv_heads, int head_dim, DenseElem elem, int window,
                                     cudaStream_t stream)
    : kv_heads_(kv_heads), dim_(head_dim), dense_(elem), elem_(elem_of(elem)),
      window_(window), stream_(stream) {
  if (kv_heads < 1 || kv_heads > 1024 || head_dim < 1 || head_dim > 4096 || window < 0) {
    throw InvalidArgument(str_cat("wide KV cache of ", kv_heads, " KV heads of ", head_dim,
                                  " dims, window ", window));
  }
}

std::string DeviceWideKVCache::type_name() const {
  return window_ > 0 ? "rotating" : dense_name(dense_);
}

size_t DeviceWideKVCache::nbytes() const {
  const int64_t held = window_ > 0 ? std::min<int64_t>(size_, window_) : size_;
  return size_t(held) * size_t(kv_heads_) * size_t(dim_) * elem_bytes(elem_) * 2;
}

void DeviceWideKVCache::append_device(const float* k, const float* v, int n) {
  if (n < 0 || (n > 0 && (k == nullptr || v == nullptr))) {
    throw InvalidArgument(str_cat("wide KV cache: append of ", n, " rows without data"));
  }
  if (n == 0) return;
  const int64_t row = int64_t(kv_heads_) * dim_;
  const size_t row_bytes = size_t(row) * elem_bytes(elem_);
  grow(keys_, size_t(size_ + n) * row_bytes, size_t(size_) * row_bytes, stream_);
  grow(values_, size_t(size_ + n) * row_bytes, size_t(size_) * row_bytes, stream_);
  cast(k, int64_t(n) * row, keys_.data() + size_t(size_) * row_bytes, elem_, stream_);
  cast(v, int64_t(n) * row, values_.data() + size_t(size_) * row_bytes, elem_, stream_);
  size_ += n;
}

void DeviceWideKVCache::append(const float* k, const float* v, int n_tokens) {
  check_append(k, v, n_tokens);
  if (n_tokens == 0) return;
  const size_t count = size_t(n_tokens) * size_t(kv_heads_) * size_t(dim_);
  DeviceBuffer<float> dk = DeviceBuffer<float>::upload(std::vector<float>(k, k + count));
  DeviceBuffer<float> dv = DeviceBuffer<float>::upload(std::vector<float>(v, v + count));
  append_device(dk.data(), dv.data(), n_tokens);
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceWideKVCache::trim(int64_t n) {
  if (n < 0 || n > size_) {
    throw InvalidArgument(str_cat("trim(", n, ") of a cache of ", size_, " tokens"));
  }
  size_ -= n;
}

void DeviceWideKVCache::attend_device(const float* q, int n_q, int n_heads, float scale,
                                      float* out) const {
  if (n_q < 1 || n_q > size_) {
    throw InvalidArgument(str_cat("wide KV cache: ", n_q, " queries over ", size_, " tokens"));
  }
  for_each_query_group(n_q, n_heads, size_, workspace_, stream_, [&](int i0, int n, int64_t len) {
    const size_t at = size_t(i0) * n_heads * dim_;
    contiguous_attention(keys_.data(), values_.data(), elem_, len, kv_heads_, dim_, q + at, n,
                         n_heads, scale, window_, workspace_.data(), out + at, stream_);
  });
}

void DeviceWideKVCache::attend(const float* q, int n_q, const AttentionParams& params,
                               float* out) const {
  check_attend(q, n_q, params, out);
  if (params.logit_softcap != 0 ||
      (params.sliding_window != 0 && params.sliding_window != window_)) {
    throw InvalidArgument("wide KV cache: attention without soft-capping, in its own window");
  }
  const size_t count = size_t(n_q) * params.n_heads * dim_;
  DeviceBuffer<float> dq = DeviceBuffer<float>::upload(std::vector<float>(q, q + count));
  DeviceBuffer<float> dout(count);
  attend_device(dq.data(), n_q, params.n_heads, params.scale, dout.data());
  TURBOKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> host = dout.download();
  std::copy(host.begin(), host.end(), out);
}

}  // namespace turbokv::cuda
