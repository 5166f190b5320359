// GFLOP/s of kernels::cpu::gemm_half (bf16 / f16 inputs, fp32 accumulation and
// result) per backend, timed as gemm_timing.hpp times the fp32 GEMM: thread CPU
// time, a warm-up product, the median of repeats.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/gemm_timing.hpp"
#include "core/dtype.hpp"
#include "core/dtype_convert.hpp"
#include "kernels/cpu/gemm_half.hpp"

namespace troupe::bench {

struct HalfGemmRate {
  std::string backend;         // "avx512bf16", "convert"
  std::string why;             // why there are no figures; empty when there are
  std::vector<double> gflops;  // median per shape
};

// One entry per gemm_half backend that takes dt (bf16 or f16): its median GFLOP/s
// on each shape over `repeats` rounds of at least min_seconds, or why it has none
// (not on this CPU).
inline std::vector<HalfGemmRate> half_gemm_rates(DType dt, const std::vector<GemmShape>& shapes,
                                                 int repeats = 3, double min_seconds = 0.1) {
  std::vector<HalfGemmRate> out;
  namespace k = kernels::cpu;
  for (k::HalfGemmBackend b : {k::HalfGemmBackend::avx512bf16, k::HalfGemmBackend::convert}) {
    if (b == k::HalfGemmBackend::avx512bf16 && dt != DType::bf16) continue;
    HalfGemmRate r;
    r.backend = k::half_gemm_backend_name(b);
    if (!k::half_gemm_backend_available(b, dt)) {
      r.why = b == k::HalfGemmBackend::avx512bf16 ? "no AVX512-BF16 on this CPU" : "not available here";
      out.push_back(r);
      continue;
    }
    for (const GemmShape& s : shapes) {
      // Operands uniform in [-1, 1), rounded to dt; C(M,N) = op(A) op(B).
      const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
      std::vector<uint16_t> A(size_t(s.ta ? s.K : s.M) * lda), B(size_t(s.tb ? s.N : s.K) * ldb);
      std::vector<float> C(size_t(s.M) * s.N);
      std::mt19937 gen(1);
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      for (auto* v : {&A, &B})
        for (auto& x : *v) x = dt == DType::bf16 ? f32_to_bf16(d(gen)) : f32_to_f16(d(gen));
      auto product = [&] {
        k::gemm_half_with(b, dt, s.ta, s.tb, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, 0.0f, C.data(),
                          s.N);
      };
      product();
      std::vector<double> rates;
      for (int round = 0; round < repeats; ++round) {
        const double t0 = thread_cpu_seconds();
        int n = 0;
        double dt_s = 0.0;
        do {
          product();
          ++n;
          dt_s = thread_cpu_seconds() - t0;
        } while (dt_s < min_seconds);
        rates.push_back(2.0 * s.M * s.N * double(s.K) * n / dt_s * 1e-9);
      }
      std::sort(rates.begin(), rates.end());
      r.gflops.push_back(rates[rates.size() / 2]);
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace troupe::bench
