// RoPE inverse frequencies from a RopeConfig, as transformers' modeling_rope_utils computes
// them: default, linear, llama3, yarn (with its attention factor) and dynamic NTK.
#pragma once

#include <cstdint>

#include "kernels/cpu/rope.h"
#include "model/config.h"

namespace turbokv {

// seq_len: the positions in use so far (last position + 1); only dynamic NTK depends on it.
RopeTable make_rope_table(const RopeConfig& rope, int head_dim, int64_t seq_len);

}  // namespace turbokv
