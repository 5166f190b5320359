#include <catch2/catch.hpp>

#include <vector>

#include "kernels/cpu/kernels.hpp"

TEST_CASE("gemm matches a naive product for every transpose", "[kernels][gemm]") {
  const int M = 5, N = 7, K = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<float> A(M * K), B(K * N), C(M * N, 1.0f);
      for (size_t i = 0; i < A.size(); ++i) A[i] = float(i % 5) - 2.0f;
      for (size_t i = 0; i < B.size(); ++i) B[i] = float(i % 3) * 0.5f - 0.25f;
      troupe::kernels::cpu::gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.5f,
                                 C.data(), N);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          double ref = 0.5;
          for (int k = 0; k < K; ++k)
            ref += double(ta ? A[k * M + i] : A[i * K + k]) * double(tb ? B[j * K + k] : B[k * N + j]);
          REQUIRE(C[i * N + j] == Approx(ref).margin(1e-5));
        }
    }
}
