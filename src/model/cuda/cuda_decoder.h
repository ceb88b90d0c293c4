// CudaDecoderModel: the decoder forward pass on an NVIDIA GPU. It executes the same
// description as the CPU's DecoderModel (model/decoder.h): the ModelConfig family flags and
// the weights DecoderModel bound, uploaded once in their stored dtype (bf16, fp16 or fp32).
// Per layer, for the T tokens of a step:
//   xn = rms_norm(x)                                   [T, H] in the weights' dtype
//   qkv = xn · [Wq; Wk; Wv]ᵀ (one cuBLAS GEMM)          [T, q + 2 kv] fp32
//   q, k, v = qkv_post(qkv): bias, q/k norm, RoPE      [T, heads | kv_heads, head_dim]
//   per group of sequences whose caches share a format: append k, v (quantized on the GPU),
//   attention on the cache (on the codes for TurboQuant and uniform)
//   x += post(attn · Woᵀ); x += post(mlp(norm(x)) or moe(norm(x)))
// then the rows that need logits: final norm, lm_head GEMM, soft-cap, copied to the host for
// the engine's sampler (which needs the whole row for penalties, logit bias and logprobs).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/cuda/device_caches.h"
#include "model/decoder.h"
#include "model/model.h"

namespace turbokv::cuda {

struct CudaModelOptions {
  // Bytes of GPU memory for the KV cache pool; 0: kv_memory_fraction of what is free after
  // the weights and the step buffers.
  size_t kv_cache_bytes = 0;
  double kv_memory_fraction = 0.9;
  int max_step_tokens = 512;  // tokens per forward step (bounds the activation buffers)
  // Batch-invariant decoding: a sequence's logits do not depend on which other sequences share
  // its forward steps (each product call takes one prefill slice or a group of decode rows;
  // decode attention splits the keys at fixed lengths), so a greedy request gives the same text
  // alone and batched. Costs weight reads at large decode batches. Dense-MLP attention models
  // only (Unsupported otherwise).
  bool batch_invariant = false;
};

// Why the GPU forward cannot run a model of this config ("" when it can).
std::string cuda_unsupported_reason(const ModelConfig& config);

class CudaDecoderModel final : public Model {
 public:
  // Uploads the weights of `host` (which it keeps for the config; its mapped files can be
  // released by the OS). Throws Unsupported when no CUDA device is usable or a part of the
  // model has no GPU path, and an Error naming the sizes when it does not fit in GPU memory.
  CudaDecoderModel(std::unique_ptr<DecoderModel> host, const CudaModelOptions& options);
  ~CudaDecoderModel() override;

  const ModelInfo& info() const override { return host_->config(); }
  std::vector<LayerSpec> layer_specs() const override { return host_->layer_specs(); }
  void forward(std::span<const Chunk> chunks) const override;

  // One sequence's caches for kv: the CPU cache plan, held on the GPU (dense and rotating
  // layers in fp16, or dense_elem).
  LayerCaches make_caches(const ResolvedKV& kv) const { return make_caches(kv, DenseElem::kF16); }
  LayerCaches make_caches(const ResolvedKV& kv, DenseElem dense_elem) const;
  DeviceCacheContext& cache_context() const { return *caches_; }
  // The most pool bytes one sequence's caches for kv take at `tokens` tokens, for admission:
  // whole blocks, their chunk share included, and the per-sequence state blocks (recurrent
  // states, the state of calibrating or sink-keeping formats). KV-shared layers take none.
  // Throws what make_caches throws for a setting the GPU cannot hold.
  size_t kv_bytes_for(const ResolvedKV& kv, int64_t tokens) const;
  const DecoderModel& host() const { return *host_; }
  // Whether a decode step multiplies any weights on int8 activations (MLX 4-bit products,
  // kernels/cuda/qmatmul.h) rather than fp32 ones.
  bool decode_uses_int8() const;
  // Whether every product takes fp32 activations (TURBOKV_F32_ACTIVATIONS=1, the reference
  // mode: dense weights held in fp32, quantized ones through the fp32 GEMV).
  static bool f32_activations();
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Impl;
  std::unique_ptr<DecoderModel> host_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<DeviceCacheContext> caches_;
  size_t weight_bytes_ = 0;
};

}  // namespace turbokv::cuda
