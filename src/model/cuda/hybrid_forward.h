// HybridForward: the GPU forward pass of the families whose layers are not all plain
// attention (qwen3_5 linear attention, gemma4 per-layer geometry and KV sharing, deepseek_v3
// latent attention), executing the same description as the CPU's DecoderModel: the
// ModelConfig's per-layer kinds and flags, and the weights DecoderModel bound, uploaded once
// (dense F32/F16/BF16 only). CudaDecoderModel hands such models to it.
//
// Per step of T tokens (all sequences together for the GEMMs), per layer:
//   xn = rms_norm(x); token mixing by the layer's kind:
//     attention        : q [| gate] , k, v GEMMs; qkv_post (bias, q/k norm, RoPE over the
//                        layer's rotary dims); [v = v_norm(v)]; per sequence: append to its
//                        device cache (paged; a dense contiguous one for heads above 256 dims;
//                        KV-shared layers: none, they read the owner's), attend;
//                        [attn *= sigmoid(gate)]; o GEMM
//     linear_attention : in_proj GEMMs; per sequence: causal conv on its device recurrent
//                        state's history, the gated delta rule on its state (the recurrence,
//                        for prefill too: faster than the chunked kernel); gated RMSNorm;
//                        out_proj
//     mla              : q (LoRA) and latent GEMMs, latent norm, RoPE of the shared key part,
//                        queries absorbed per head; per sequence: the latent row appended to a
//                        dense device cache (never quantized: a paged one up to 256 dims, a
//                        DeviceLatentCache above), attended as one KV head; the latent output
//                        expanded per head; o GEMM
//   x += post(out); x += post(mlp or moe (routed on the host by the CPU's moe_route, shared
//   expert added, gated for qwen3_5_moe)); [per-layer input branch]; [x *= layer_scalar]
// Attention and the recurrent kernels run one sequence at a time (synchronizing appends);
// this executor is built for exactness, not yet for speed.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "kv/cache_policy.h"
#include "kv/cuda/device_caches.h"
#include "model/decoder.h"

namespace turbokv::cuda {

// True when a model of this config needs HybridForward (some layer is not plain attention of
// the model-wide shape, or a family feature only it runs).
bool needs_hybrid_forward(const ModelConfig& c);
// Why HybridForward cannot run it ("" when it can).
std::string hybrid_unsupported_reason(const ModelConfig& c);

class HybridForward {
 public:
  // Uploads host's weights. Throws Unsupported for quantized weights and Error when they do not
  // fit in GPU memory.
  HybridForward(const DecoderModel& host, cudaStream_t stream, const Gemm& gemm,
                int max_step_tokens);
  ~HybridForward();

  size_t weight_bytes() const;
  // One sequence's caches for a plan: device KV caches for attention and latent layers, a
  // DeviceRecurrentState per linear-attention layer, views for KV-shared layers.
  static LayerCaches make_caches(DeviceCacheContext& context,
                                 const std::vector<LayerCachePlan>& plan, DenseElem dense_elem,
                                 bool fused);
  // Model::forward (chunks already checked).
  void forward(std::span<const Model::Chunk> chunks);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace turbokv::cuda
