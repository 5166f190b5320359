// A process that runs one product through the measured dispatch, for the tests of
// test_gemm_dispatch.cpp (the choices are made once per process, so each case needs fresh
// processes, run with its own environment).
//
//   gemm_choice_probe <f32|bf16|f16> <NN|NT|TN|TT> M N K
//
// Prints, one per line:
//   backend=<name>     what gemm_dispatch picked for the shape
//   how=<how>          measured | recorded | forced-or-small (no record in this process)
//   timings=<n>        how many backends were timed
//   bits=<hex>         a hash of the result's bits (the same backend and inputs give the same)
//   max_rel_err=<x>    against a double product of the same (rounded) inputs
// and exits 0, or prints the error and exits 1.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "core/dtype_convert.hpp"
#include "kernels/cpu/gemm_backends.hpp"
#include "kernels/cpu/gemm_dispatch.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"

namespace k = troupe::kernels::cpu;
using troupe::DType;

int main(int argc, char** argv) try {
  if (argc != 6) {
    std::fprintf(stderr, "usage: gemm_choice_probe <f32|bf16|f16> <NN|NT|TN|TT> M N K\n");
    return 2;
  }
  const std::string dts = argv[1], tr = argv[2];
  const DType dt = dts == "f32" ? DType::f32 : dts == "bf16" ? DType::bf16 : DType::f16;
  const bool ta = tr[0] == 'T', tb = tr[1] == 'T';
  const int M = std::stoi(argv[3]), N = std::stoi(argv[4]), K = std::stoi(argv[5]);

  std::mt19937 gen(7);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> a(size_t(M) * K), b(size_t(K) * N), c(size_t(M) * N);
  for (float& x : a) x = d(gen);
  for (float& x : b) x = d(gen);
  std::vector<uint16_t> ah(a.size()), bh(b.size());
  if (dt != DType::f32) {
    k::to_half(dt, ah.data(), a.data(), a.size());
    k::to_half(dt, bh.data(), b.data(), b.size());
    k::from_half(dt, a.data(), ah.data(), a.size());  // the reference sees the rounded inputs
    k::from_half(dt, b.data(), bh.data(), b.size());
  }
  const int lda = ta ? M : K, ldb = tb ? K : N;
  const int backend = k::gemm_dispatch(dt, ta, tb, M, N, K);
  if (dt == DType::f32)
    k::gemm(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), N);
  else
    k::gemm_half(dt, ta, tb, M, N, K, ah.data(), lda, bh.data(), ldb, 0.0f, c.data(), N);

  double worst = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (int p = 0; p < K; ++p) {
        const double x = ta ? a[size_t(p) * M + i] : a[size_t(i) * K + p];
        const double y = tb ? b[size_t(j) * K + p] : b[size_t(p) * N + j];
        ref += x * y;
        mag += std::fabs(x * y);
      }
      worst = std::max(worst, std::fabs(c[size_t(i) * N + j] - ref) / (mag + 1e-30));
    }
  uint64_t h = 1469598103934665603ull;
  for (float x : c) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    h = (h ^ u) * 1099511628211ull;
  }
  const char* name = dt == DType::f32 ? k::gemm_backend_name(static_cast<k::GemmBackend>(backend))
                                      : k::half_gemm_backend_name(static_cast<k::HalfGemmBackend>(backend));
  std::string how = "forced-or-small";
  size_t timed = 0;
  for (const k::GemmChoice& ch : k::gemm_choices())
    if (ch.dt == dt && ch.ta == ta && ch.tb == tb && ch.M == M && ch.N == N && ch.K == K) {
      how = ch.how;
      timed = ch.timings.size();
    }
  std::printf("backend=%s\nhow=%s\ntimings=%zu\nbits=%016llx\nmax_rel_err=%.3g\n", name, how.c_str(), timed,
              static_cast<unsigned long long>(h), worst);
  return 0;
} catch (const std::exception& e) {
  std::printf("error: %s\n", e.what());
  return 1;
}
