#include "core/cpu.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace turbokv {

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

namespace {

#if defined(__x86_64__) || defined(_M_X64)
// F16C from CPUID leaf 1 (ECX bit 29): clang has no "f16c" for __builtin_cpu_supports.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
// AVX-VNNI from CPUID leaf 7, subleaf 1 (EAX bit 4): clang 14 has no "avxvnni" either.
bool cpu_has_avxvnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
}
#endif

}  // namespace

bool cpu_has_avx2() {
  static const bool has = [] {
    if (env_flag("TURBOKV_FORCE_SCALAR")) return false;
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
#else
    return false;
#endif
  }();
  return has;
}

bool cpu_has_avx512() {
  static const bool has = [] {
    if (!cpu_has_avx2() || env_flag("TURBOKV_FORCE_AVX2")) return false;
#if defined(__x86_64__) || defined(_M_X64)
    // __builtin_cpu_supports also checks that the OS saves the AVX-512 state (XCR0).
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return false;
#endif
  }();
  return has;
}

const char* cpu_feature_names() {
  static const std::string names = [] {
    std::string out;
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    const std::pair<const char*, bool> features[] = {
        {"avx2", __builtin_cpu_supports("avx2")},
        {"fma", __builtin_cpu_supports("fma")},
        {"f16c", cpu_has_f16c()},
        {"avx512f", __builtin_cpu_supports("avx512f")},
        {"avx512bw", __builtin_cpu_supports("avx512bw")},
        {"avx512vl", __builtin_cpu_supports("avx512vl")},
        {"avx512dq", __builtin_cpu_supports("avx512dq")},
        {"avx512vbmi", __builtin_cpu_supports("avx512vbmi")},
        {"avx512vnni", __builtin_cpu_supports("avx512vnni")},
        {"avxvnni", cpu_has_avxvnni()},
    };
    for (const auto& [name, present] : features) {
      if (!present) continue;
      if (!out.empty()) out += ' ';
      out += name;
    }
#endif
    return out.empty() ? std::string("none") : out;
  }();
  return names.c_str();
}

}  // namespace turbokv
