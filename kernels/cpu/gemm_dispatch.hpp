// Which backend runs a GEMM of a given shape: the one measured fastest on it, not the one
// a CPU flag suggests (on Sapphire Rapids vdpbf16ps runs at half the fp32 FMA rate while
// oneDNN's AMX kernels run at several times it).
//
// The first product of a shape — (dtype, transposes, M, N, K) — times every backend that
// this CPU and build can run (gemm_backends.hpp for fp32, gemm_half.hpp for bf16 and f16)
// on operands of that shape, capped at ~0.5 GFLOP per run: one warm-up run each, then the
// best of three, the backends taking turns so that load from elsewhere falls on all alike,
// in the thread's CPU time. The fastest runs that shape from then on. A few milliseconds
// per shape, once; the choices are logged (spdlog, info: a worker's log).
//
// The choices are also kept in a per-machine file, so that every later process on the
// machine — the other ranks of a job, a resumed run, a second run of the same seed — runs
// the same backend on the same shape and so computes the same bits. Processes that measure
// a shape at once agree through the file (an exclusive lock; the first record wins).
//
//   TROUPE_GEMM_CACHE=<dir>   where the file lives (default $XDG_CACHE_HOME/troupe or
//                             ~/.cache/troupe); "off": choices stay in the process.
//   TROUPE_GEMM=<name>        forces the fp32 backend, TROUPE_GEMM_HALF=<name> the 16-bit one
//                             (no measurement).
//
// The file's name carries a hash of what the choice depends on (the CPU model and features,
// TROUPE_MAX_CPU_ISA, OPENBLAS_CORETYPE, ONEDNN_MAX_CPU_ISA, the oneDNN and troupe builds), so
// machines sharing a home directory never read each other's choices. The file is a cache:
// a line that does not parse, names an unknown backend or one this process cannot run is
// ignored, and a file over 1 MiB is not read.
//
// Products under ~2 MFLOP are not measured (their timing would be noise): they run the
// static preference (gemm_default_backend / half_gemm_default_backend).
#pragma once

#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace troupe::kernels::cpu {

struct GemmTiming {
  std::string backend;
  double seconds = 0;  // per run, on the (possibly capped) measured shape
  double gflops = 0;
};

struct GemmChoice {
  DType dt = DType::f32;
  bool ta = false, tb = false;
  int M = 0, N = 0, K = 0;
  std::string backend;              // what runs this shape
  std::string how;                  // "measured", "recorded" (the machine's file), "forced", "small"
  std::vector<GemmTiming> timings;  // when measured here
};

// The backend for a product: a GemmBackend for f32, a HalfGemmBackend for bf16 and f16, as
// an int. Measures on first use as above. Throws troupe::Error for a bad TROUPE_GEMM /
// TROUPE_GEMM_HALF / TROUPE_MAX_CPU_ISA.
int gemm_dispatch(DType dt, bool ta, bool tb, int M, int N, int K);

// Times every available backend of dt on the shape now (nothing recorded): for
// `troupe version --bench` and the benchmarks.
std::vector<GemmTiming> gemm_measure(DType dt, bool ta, bool tb, int M, int N, int K);

// Every choice this process has made, oldest first.
std::vector<GemmChoice> gemm_choices();

// "bf16 NT 2048x1536x512: onednn 0.41 ms, avx512bf16 0.52 ms -> onednn (measured)".
std::string describe(const GemmChoice& c);

// The machine's file of choices, or "" when TROUPE_GEMM_CACHE=off or no directory is usable.
std::string gemm_cache_file();

}  // namespace troupe::kernels::cpu
