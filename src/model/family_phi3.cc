// Phi-3: a Llama-style decoder whose q/k/v live in one fused qkv_proj ([q; k; v] rows) and
// whose gate and up projections live in one gate_up_proj ([gate; up] rows); optional partial
// rotary; sliding_window on every layer when set.
#include "model/families.h"

namespace turbokv {

void configure_phi3(const nlohmann::json& j, const std::string& path, ModelConfig& c) {
  c.fused_qkv = true;
  c.fused_gate_up = true;
  set_uniform_sliding_window(j, path, c);
}

}  // namespace turbokv
