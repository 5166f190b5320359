// Single-thread GEMM throughput of every available backend on square and
// training shapes, fp32 and then 16-bit (gemm_half, bf16 and f16 inputs with
// fp32 accumulation). Prints the tables, the register ceilings of the core (a
// loop of independent FMAs / vdpbf16ps on registers, no memory), and
//   peak_gflops=<best>        the fp32 ceiling that training MFU is measured against
//   bf16_peak_gflops=<best>   the same for bf16 training (best median of gemm_half on bf16)
// Backends take turns within each repeat, so that load from other processes falls
// on all alike.
//
//   gemm_peak [repeats]
// OpenBLAS picks its kernel from OPENBLAS_CORETYPE at load time; run once with
// and once without it to compare (the core name is printed).
#include <cblas.h>
#include <immintrin.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/gemm_timing.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"

namespace {

namespace k = troupe::kernels::cpu;
using troupe::bench::thread_cpu_seconds;

// Register ceilings: independent accumulators (enough chains to cover the
// latency of both FMA ports), each step one instruction per chain, no memory.
// One round runs kSteps steps and returns a sum of the accumulators, so that
// nothing is optimised away; the rate is the best of five rounds, in GFLOP/s of
// thread CPU time.
constexpr int kChains = 28;     // zmm: as many as the GEMM micro-kernels keep
constexpr int kYmmChains = 12;  // ymm0-15 hold them and the two operands
constexpr long kSteps = 1 << 24;

double ceiling_gflops(double flops_per_round, float (*round)()) {
  volatile float sink = 0.0f;
  double best = 0.0;
  for (int r = 0; r < 5; ++r) {
    const double t0 = thread_cpu_seconds();
    sink = sink + round();
    best = std::max(best, flops_per_round / (thread_cpu_seconds() - t0) * 1e-9);
  }
  return best;
}

__attribute__((target("avx512f"))) float fp32_round_avx512() {
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(float(j));
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-6f);
  for (long s = 0; s < kSteps; ++s)
#pragma GCC unroll 28
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_fmadd_ps(acc[j], m, a);
  float out[16], sum = 0.0f;
  for (int j = 0; j < kChains; ++j) {
    _mm512_storeu_ps(out, acc[j]);
    sum += out[0];
  }
  return sum;
}

__attribute__((target("avx2,fma"))) float fp32_round_avx2() {
  __m256 acc[kYmmChains];
  for (int j = 0; j < kYmmChains; ++j) acc[j] = _mm256_set1_ps(float(j));
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-6f);
  for (long s = 0; s < kSteps; ++s)
#pragma GCC unroll 12
    for (int j = 0; j < kYmmChains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, a);
  float out[8], sum = 0.0f;
  for (int j = 0; j < kYmmChains; ++j) {
    _mm256_storeu_ps(out, acc[j]);
    sum += out[0];
  }
  return sum;
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_round_avx512() {
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(float(j));
  // bf16 pairs of 2^-8: each step adds 2^-15 per lane, far from overflow.
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3b803b80);
  for (long s = 0; s < kSteps; ++s)
#pragma GCC unroll 28
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, x);
  float out[16], sum = 0.0f;
  for (int j = 0; j < kChains; ++j) {
    _mm512_storeu_ps(out, acc[j]);
    sum += out[0];
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  namespace tb = troupe::bench;
  using troupe::DType;
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("gemm default backend: %s   openblas core: %s (OPENBLAS_CORETYPE=%s)   repeats: %d (median)\n",
              k::gemm_backend(), openblas_get_corename(), coretype ? coretype : "<unset>", repeats);

  const auto backends = tb::available_gemm_backends();
  std::printf("%-20s %2s %5s %5s %5s", "shape", "op", "M", "N", "K");
  for (auto b : backends) std::printf(" %16s", k::gemm_backend_name(b));
  std::printf("   GFLOP/s: median (best)\n");
  double best = 0.0;
  for (const auto& s : tb::gemm_shapes()) {
    std::printf("%-20s %c%c %5d %5d %5d", s.name.c_str(), s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K);
    for (const auto& r : tb::gemm_gflops(backends, s, repeats)) {
      best = std::max(best, r.median);
      std::printf("   %6.1f (%6.1f)", r.median, r.best);
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  // 16-bit inputs, fp32 accumulation and output: one column per dtype and backend.
  const auto bf16_backends = tb::available_half_gemm_backends(DType::bf16);
  const auto f16_backends = tb::available_half_gemm_backends(DType::f16);
  std::printf("\n16-bit GEMM (gemm_half), default bf16: %s, f16: %s\n",
              k::half_gemm_backend_name(k::half_gemm_default_backend(DType::bf16)),
              k::half_gemm_backend_name(k::half_gemm_default_backend(DType::f16)));
  std::printf("%-20s %2s %5s %5s %5s", "shape", "op", "M", "N", "K");
  for (auto b : bf16_backends)
    std::printf(" %16s", ("bf16 " + std::string(k::half_gemm_backend_name(b))).c_str());
  for (auto b : f16_backends)
    std::printf(" %16s", ("f16 " + std::string(k::half_gemm_backend_name(b))).c_str());
  std::printf("   GFLOP/s: median (best)\n");
  double bf16_best = 0.0;
  for (const auto& s : tb::gemm_shapes()) {
    std::printf("%-20s %c%c %5d %5d %5d", s.name.c_str(), s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K);
    for (const auto& r : tb::half_gemm_gflops(bf16_backends, DType::bf16, s, repeats)) {
      bf16_best = std::max(bf16_best, r.median);
      std::printf("   %6.1f (%6.1f)", r.median, r.best);
    }
    for (const auto& r : tb::half_gemm_gflops(f16_backends, DType::f16, s, repeats))
      std::printf("   %6.1f (%6.1f)", r.median, r.best);
    std::printf("\n");
    std::fflush(stdout);
  }

  __builtin_cpu_init();
  const bool zmm = __builtin_cpu_supports("avx512f");
  const bool ymm_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  std::printf("\nregister ceiling, one core: fp32 ");
  // FMA: 2 flops per lane (16 zmm, 8 ymm lanes); vdpbf16ps: 2 products and 2 adds per fp32 lane.
  if (zmm)
    std::printf("%.1f GFLOP/s (avx512 fma)",
                ceiling_gflops(double(kSteps) * kChains * 32, fp32_round_avx512));
  else if (ymm_fma)
    std::printf("%.1f GFLOP/s (avx2 fma)", ceiling_gflops(double(kSteps) * kYmmChains * 16, fp32_round_avx2));
  else
    std::printf("n/a (no FMA)");
  std::printf("   bf16 ");
  if (k::half_gemm_backend_available(k::HalfGemmBackend::avx512bf16, DType::bf16))
    std::printf("%.1f GFLOP/s (vdpbf16ps)\n",
                ceiling_gflops(double(kSteps) * kChains * 64, bf16_round_avx512));
  else
    std::printf("n/a (no AVX512-BF16)\n");

  std::printf("peak_gflops=%.1f\n", best);
  std::printf("bf16_peak_gflops=%.1f\n", bf16_best);
  return 0;
}
