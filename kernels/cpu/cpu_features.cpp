#include "kernels/cpu/cpu_features.hpp"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

#include "core/error.hpp"

namespace troupe::kernels::cpu {
namespace {

// The brand string of CPUID leaves 0x80000002..4, trimmed.
std::string brand_string() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000004u) return "unknown x86-64";
  char text[49] = {};
  for (unsigned leaf = 0; leaf < 3; ++leaf) {
    __cpuid(0x80000002u + leaf, a, b, c, d);
    std::memcpy(text + 16 * leaf, &a, 4);
    std::memcpy(text + 16 * leaf + 4, &b, 4);
    std::memcpy(text + 16 * leaf + 8, &c, 4);
    std::memcpy(text + 16 * leaf + 12, &d, 4);
  }
  std::string s(text);
  const size_t first = s.find_first_not_of(' '), last = s.find_last_not_of(' ');
  return first == std::string::npos ? "unknown x86-64" : s.substr(first, last - first + 1);
}

// AMX-FP16 is CPUID.(7,1):EAX[21]; GCC 12's __builtin_cpu_supports does not know it.
bool cpuid_amx_fp16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 1, a, b, c, d);
  return (a >> 21) & 1u;
}

CpuFeatures detect() {
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.f16c = f.avx2 && __builtin_cpu_supports("f16c");
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  f.avx512_fp16 = f.avx512 && __builtin_cpu_supports("avx512fp16");
  f.amx_bf16 = f.avx512_bf16 && __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-tile");
  f.amx_fp16 = f.amx_bf16 && cpuid_amx_fp16();
  f.model = brand_string();
  return f;
}

// f with everything above `cap` turned off.
CpuFeatures capped(CpuFeatures f, const std::string& cap) {
  f.cap = cap;
  if (cap.empty() || cap == "all") return f;
  const int level = cap == "avx2" ? 0 : cap == "avx512" ? 1 : cap == "avx512_bf16" ? 2 : -1;
  TROUPE_CHECK(level >= 0, "TROUPE_MAX_CPU_ISA=", cap, " is not one of avx2, avx512, avx512_bf16, all");
  if (level < 2) f.avx512_bf16 = f.avx512_fp16 = false;
  if (level < 1) f.avx512 = false;
  f.amx_bf16 = f.amx_fp16 = false;
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    const char* env = std::getenv("TROUPE_MAX_CPU_ISA");
    return capped(detect(), env ? env : "");
  }();
  return f;
}

std::string cpu_feature_list(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.f16c, "f16c");
  add(f.avx512, "avx512");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_fp16, "avx512_fp16");
  add(f.amx_bf16, "amx_bf16");
  add(f.amx_fp16, "amx_fp16");
  if (s.empty()) s = "sse2";
  return s;
}

}  // namespace troupe::kernels::cpu
