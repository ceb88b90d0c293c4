#include "core/cpu.h"

#include <cstdlib>
#include <cstring>

namespace turbokv {

bool cpu_has_avx2() {
  static const bool has = [] {
    const char* force = std::getenv("TURBOKV_FORCE_SCALAR");
    if (force != nullptr && std::strcmp(force, "0") != 0 && force[0] != '\0') return false;
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return false;
#endif
  }();
  return has;
}

}  // namespace turbokv
