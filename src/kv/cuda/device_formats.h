// The device cache formats (device_caches.h's DeviceFormat): which kernels write and read a
// layer's blocks, and how its blocks convert to and from the CPU cache of the same
// configuration.
//   dense f32 / f16 / bf16          generic paged kernels; the fused fp16 d = 128 kernel for
//                                   global layers without soft-capping
//   TurboQuant, head_dim 128, integer key and value bits with a fused kernel (K3/V4, K4/V3,
//   K4/V4, K3/V3, K2/V3, K3/V2), with centering, without sink or recent tokens
//                                   the fused kernels (tq_quantize, tq_attention)
//   other TurboQuant, uniform       the generic paged kernels (kernels/cuda/kvcache): every
//                                   bits / head_dim / split setting, centering, sink and
//                                   recent tokens,
//                                   uniform with the Hadamard rotation
#pragma once

#include <memory>
#include <string>

#include "kv/cuda/device_caches.h"

namespace turbokv::cuda {

// A string that is equal for plans the same format serves.
std::string format_key(const LayerCachePlan& plan, DenseElem dense_elem, bool fused);

// fused: the fused kernels may serve the layer (false when its attention soft-caps the
// logits). Throws Unsupported naming the configuration when no device format holds it.
std::shared_ptr<const DeviceFormat> make_device_format(const LayerCachePlan& plan,
                                                       DenseElem dense_elem, bool fused);

// The generic paged kernels' formats (device_formats_generic.cc).
std::shared_ptr<const DeviceFormat> make_generic_turboquant_format(const LayerCachePlan& plan);
std::shared_ptr<const DeviceFormat> make_generic_uniform_format(const LayerCachePlan& plan);

KVDType kv_dtype_of(DenseElem elem);

}  // namespace turbokv::cuda
