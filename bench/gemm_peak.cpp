// Single-thread fp32 GEMM throughput of every available backend on square and
// training shapes. Prints a table and "peak_gflops=<best>", the ceiling that
// training MFU is measured against (the best median). Backends take turns
// within each repeat, so that load from other processes falls on all alike.
//
//   gemm_peak [repeats]
// OpenBLAS picks its kernel from OPENBLAS_CORETYPE at load time; run once with
// and once without it to compare (the core name is printed).
#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/gemm_timing.hpp"
#include "kernels/cpu/kernels.hpp"

int main(int argc, char** argv) {
  namespace k = troupe::kernels::cpu;
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("gemm default backend: %s   openblas core: %s (OPENBLAS_CORETYPE=%s)   repeats: %d (median)\n",
              k::gemm_backend(), openblas_get_corename(), coretype ? coretype : "<unset>", repeats);

  const auto backends = troupe::bench::available_gemm_backends();
  std::printf("%-20s %2s %5s %5s %5s", "shape", "op", "M", "N", "K");
  for (auto b : backends) std::printf(" %16s", k::gemm_backend_name(b));
  std::printf("   GFLOP/s: median (best)\n");
  double best = 0.0;
  for (const auto& s : troupe::bench::gemm_shapes()) {
    std::printf("%-20s %c%c %5d %5d %5d", s.name.c_str(), s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K);
    for (const auto& r : troupe::bench::gemm_gflops(backends, s, repeats)) {
      best = std::max(best, r.median);
      std::printf("   %6.1f (%6.1f)", r.median, r.best);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("peak_gflops=%.1f\n", best);
  return 0;
}
