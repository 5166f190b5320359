// What this CPU can run, as the CPU kernels see it: one place that reads CPUID, and one
// knob that hides features so that every fallback can be tested on any machine.
//
//   TROUPE_MAX_CPU_ISA=avx2         no AVX-512 at all: the fp32 GEMM falls back to OpenBLAS,
//                                   16-bit products to convert; oneDNN is held to AVX2.
//   TROUPE_MAX_CPU_ISA=avx512       AVX-512F/BW/VL/DQ but no AVX512-BF16 or AMX.
//   TROUPE_MAX_CPU_ISA=avx512_bf16  everything but AMX.
//   unset (or "all")                everything the CPU has.
// oneDNN is held to the same level (dnnl_set_max_cpu_isa) before its first primitive. The
// element-wise kernels' AVX2/AVX-512 clones (vec_math.hpp) are picked by the loader and
// give the same bits as the baseline code, so they are not held back.
#pragma once

#include <string>

namespace troupe::kernels::cpu {

struct CpuFeatures {
  bool avx2 = false;         // AVX2 + FMA
  bool f16c = false;         // AVX2 + F16C: vectorised fp16 conversions
  bool avx512 = false;       // AVX-512 F, BW, VL, DQ + FMA
  bool avx512_bf16 = false;  // + AVX512-BF16 (vdpbf16ps)
  bool amx_bf16 = false;     // AMX tiles with bf16 (tdpbf16ps); the OS must grant the tile state
  bool amx_fp16 = false;
  bool avx512_fp16 = false;
  std::string model;  // the CPU's brand string, e.g. "AMD EPYC 9R45"
  std::string cap;    // TROUPE_MAX_CPU_ISA as applied ("" when unset)
};

// The features, after TROUPE_MAX_CPU_ISA; read once. An unknown TROUPE_MAX_CPU_ISA throws
// troupe::Error (every call, so the message reaches whoever asks first).
const CpuFeatures& cpu_features();

// "avx512_bf16 amx_bf16 ..." (the features present, for logs and `troupe version`).
std::string cpu_feature_list(const CpuFeatures& f);

}  // namespace troupe::kernels::cpu
