// The GPU tests hold the GPU to the CPU's results, so the CPU's decode attention on TurboQuant
// codes runs its exact kernel here; its 8-bit products are tested against their own bounds in
// tests/kv/turboquant_decode_test.cc.
#include "kernels/cpu/attention_codes.h"

namespace {

const bool kExactCpuAttention = [] {
  turbokv::set_code_products(turbokv::CodeProducts::kExact);
  return true;
}();

}  // namespace
