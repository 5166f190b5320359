// GEMM against a naive double-precision product, for every backend this build
// and CPU offer: all transposes, odd sizes around the 14x32 micro-tile and the
// 16-wide vectors, padded strides, alpha/beta, beta == 0 over NaN, K == 0.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/gemm_backends.hpp"
#include "kernels/cpu/gemm_dispatch.hpp"
#include "kernels/cpu/kernels.hpp"

using troupe::kernels::cpu::GemmBackend;
namespace k = troupe::kernels::cpu;

namespace {

std::vector<GemmBackend> available_backends() {
  std::vector<GemmBackend> out;
  for (GemmBackend b : {GemmBackend::avx512, GemmBackend::openblas, GemmBackend::dnnl})
    if (k::gemm_backend_available(b)) out.push_back(b);
  return out;
}

struct Case {
  bool ta, tb;
  int M, N, K;
  int pad_a, pad_b, pad_c;  // extra elements per row beyond the minimal stride
  float alpha, beta;
};

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Runs one case through backend b and checks every element of C, and that the
// padding between rows of C is untouched.
void check_case(GemmBackend b, const Case& c) {
  const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int lda = std::max(a_cols, 1) + c.pad_a, ldb = std::max(b_cols, 1) + c.pad_b,
            ldc = std::max(c.N, 1) + c.pad_c;
  const auto A = random_vec(size_t(a_rows) * lda + 1, 1u + c.M * 7u + c.K);
  const auto B = random_vec(size_t(b_rows) * ldb + 1, 2u + c.N * 5u + c.K);
  auto C = random_vec(size_t(std::max(c.M, 1)) * ldc, 3u + c.M + c.N);
  const float sentinel = 12345.0f;
  for (int i = 0; i < c.M; ++i)
    for (int j = c.N; j < ldc; ++j) C[size_t(i) * ldc + j] = sentinel;
  if (c.beta == 0.0f)  // beta == 0 must not read C: garbage NaN would leak through 0 * NaN
    for (int i = 0; i < c.M; ++i)
      for (int j = 0; j < c.N; ++j) C[size_t(i) * ldc + j] = std::numeric_limits<float>::quiet_NaN();
  const auto C0 = C;

  k::gemm_with(b, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);

  INFO("backend=" << k::gemm_backend_name(b) << " ta=" << c.ta << " tb=" << c.tb << " M=" << c.M
                  << " N=" << c.N << " K=" << c.K << " lda=" << lda << " ldb=" << ldb << " ldc=" << ldc
                  << " alpha=" << c.alpha << " beta=" << c.beta);
  int bad = 0;
  for (int i = 0; i < c.M; ++i) {
    for (int j = 0; j < c.N; ++j) {
      double ref = 0.0, mag = 0.0;
      for (int p = 0; p < c.K; ++p) {
        const double a = c.ta ? A[size_t(p) * lda + i] : A[size_t(i) * lda + p];
        const double bb = c.tb ? B[size_t(j) * ldb + p] : B[size_t(p) * ldb + j];
        ref += a * bb;
        mag += std::fabs(a * bb);
      }
      ref *= c.alpha;
      mag *= std::fabs(c.alpha);
      if (c.beta != 0.0f) {
        ref += double(c.beta) * C0[size_t(i) * ldc + j];
        mag += std::fabs(double(c.beta) * C0[size_t(i) * ldc + j]);
      }
      const double got = C[size_t(i) * ldc + j];
      // fp32 accumulation error grows with the sum of magnitudes, not the result.
      const double tol = 1e-6 + 4e-7 * mag * std::sqrt(double(c.K) + 1.0);
      if (!(std::fabs(got - ref) <= tol) && bad++ < 5)
        FAIL_CHECK("C(" << i << "," << j << ")=" << got << " ref=" << ref);
    }
    for (int j = c.N; j < ldc; ++j)
      if (C[size_t(i) * ldc + j] != sentinel && bad++ < 5) FAIL_CHECK("padding of C row " << i << " written");
  }
  REQUIRE(bad == 0);
}

}  // namespace

TEST_CASE("gemm reports its candidates, and runs the backend the dispatch picks", "[kernels][gemm]") {
  // Unforced, gemm_backend() lists the measured candidates: every available backend.
  const std::string name = k::gemm_backend();
  const bool forced = std::getenv("TROUPE_GEMM") != nullptr && *std::getenv("TROUPE_GEMM") != '\0';
  for (GemmBackend b : available_backends())
    if (!forced) CHECK(name.find(k::gemm_backend_name(b)) != std::string::npos);
  REQUIRE(k::gemm_backend_available(GemmBackend::openblas));
  // gemm() gives the bits of gemm_with(the backend the dispatch names) on a measured shape.
  const int M = 190, N = 230, K = 310;
  std::vector<float> A(size_t(M) * K), B(size_t(K) * N), C1(size_t(M) * N), C2(size_t(M) * N);
  for (size_t i = 0; i < A.size(); ++i) A[i] = float(int(i * 7 % 11) - 5) / 8.0f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = float(int(i * 5 % 13) - 6) / 8.0f;
  const auto chosen = static_cast<GemmBackend>(k::gemm_dispatch(troupe::DType::f32, false, true, M, N, K));
  CHECK(k::gemm_backend_available(chosen));
  k::gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C1.data(), N);
  k::gemm_with(chosen, false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C2.data(), N);
  REQUIRE(std::memcmp(C1.data(), C2.data(), sizeof(float) * C1.size()) == 0);
}

TEST_CASE("gemm matches a naive product for every transpose", "[kernels][gemm]") {
  const int M = 5, N = 7, K = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<float> A(M * K), B(K * N), C(M * N, 1.0f);
      for (size_t i = 0; i < A.size(); ++i) A[i] = float(i % 5) - 2.0f;
      for (size_t i = 0; i < B.size(); ++i) B[i] = float(i % 3) * 0.5f - 0.25f;
      k::gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.5f, C.data(), N);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          double ref = 0.5;
          for (int p = 0; p < K; ++p)
            ref += double(ta ? A[p * M + i] : A[i * K + p]) * double(tb ? B[j * K + p] : B[p * N + j]);
          REQUIRE(C[i * N + j] == Approx(ref).margin(1e-5));
        }
    }
}

TEST_CASE("gemm backends match a double reference on odd sizes and transposes", "[kernels][gemm]") {
  const int sizes[] = {1, 3, 17, 31, 33, 65, 129};
  for (GemmBackend b : available_backends())
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int M : sizes)
          for (int N : sizes) {
            // K runs through the same odd sizes, tied to (M, N) to keep the case count down.
            const int K = sizes[(M + 3 * N) % 7];
            check_case(b, {ta, tb, M, N, K, 0, 0, 0, 1.0f, 0.0f});
          }
}

TEST_CASE("gemm backends handle K blocks, row/column blocks and padded strides", "[kernels][gemm]") {
  // K = 777, 600, 517 cross the 384-deep K block (the first block applies beta,
  // later ones accumulate); M = 350 crosses the 336-row A block; N = 1030 crosses
  // the 512-column B block twice. lda = 1024 (K = 300 + 724 padding) and 2048
  // take the path that packs a non-transposed A (row strides that crowd L1 sets).
  const Case cases[] = {
      {false, false, 257, 33, 777, 3, 5, 7, 1.0f, 0.0f},
      {false, true, 31, 257, 600, 1, 2, 3, 0.5f, 1.0f},
      {true, false, 350, 65, 129, 17, 0, 1, -1.5f, 0.25f},
      {true, true, 65, 129, 257, 0, 9, 0, 2.0f, -1.0f},
      {false, true, 17, 1030, 31, 4, 4, 4, 1.0f, 1.0f},
      {false, false, 1, 1, 1, 0, 0, 0, 3.0f, 0.0f},
      {true, true, 3, 1, 517, 2, 0, 0, 1.0f, 0.5f},
      {false, false, 129, 96, 64, 0, 0, 32, 1.0f, 0.0f},
      {false, false, 45, 70, 300, 724, 0, 0, 1.0f, 0.0f},
      {false, true, 31, 33, 400, 1648, 1, 0, 0.5f, 2.0f},
      // Packed A with N over one column block: A is packed once per K block for all of them.
      {true, false, 350, 530, 390, 3, 0, 2, 1.0f, 0.5f},
      {false, true, 30, 600, 500, 524, 0, 0, 1.0f, 0.0f},
      {true, true, 29, 1030, 400, 0, 1, 0, -0.5f, 1.0f},
  };
  for (GemmBackend b : available_backends())
    for (const Case& c : cases) check_case(b, c);
}

TEST_CASE("gemm alpha/beta combinations, beta == 0 over NaN", "[kernels][gemm]") {
  const float alphas[] = {1.0f, -0.5f, 2.0f};
  const float betas[] = {0.0f, 1.0f, -2.0f, 0.5f};
  for (GemmBackend b : available_backends())
    for (float alpha : alphas)
      for (float beta : betas)
        for (bool ta : {false, true})
          for (bool tb : {false, true}) check_case(b, {ta, tb, 33, 47, 65, 1, 3, 2, alpha, beta});
}

TEST_CASE("gemm with K == 0 or alpha == 0 scales C by beta without reading A or B", "[kernels][gemm]") {
  for (GemmBackend b : available_backends()) {
    INFO("backend=" << k::gemm_backend_name(b));
    const int M = 3, N = 5, ldc = 6;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> C(M * ldc, nan);
    std::vector<float> A(M * 4, nan), B(4 * N, nan);
    k::gemm_with(b, false, false, M, N, 0, 1.0f, A.data(), 1, B.data(), N, 0.0f, C.data(), ldc);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) REQUIRE(C[i * ldc + j] == 0.0f);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) C[i * ldc + j] = float(i + j);
    k::gemm_with(b, false, false, M, N, 0, 1.0f, A.data(), 1, B.data(), N, 2.0f, C.data(), ldc);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) REQUIRE(C[i * ldc + j] == 2.0f * float(i + j));
    k::gemm_with(b, false, false, M, N, 4, 0.0f, A.data(), 4, B.data(), N, 0.5f, C.data(), ldc);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) REQUIRE(C[i * ldc + j] == float(i + j));
    REQUIRE(std::isnan(C[ldc - 1]));  // padding untouched
  }
}

TEST_CASE("gemm is deterministic: same inputs give the same bits", "[kernels][gemm]") {
  const int M = 300, N = 200, K = 700;
  const auto A = random_vec(size_t(M) * K, 11), B = random_vec(size_t(K) * N, 12);
  for (GemmBackend b : available_backends())
    for (bool ta : {false, true}) {
      INFO("backend=" << k::gemm_backend_name(b) << " ta=" << ta);
      std::vector<float> C1(size_t(M) * N, 1.0f), C2(size_t(M) * N, -7.0f);
      k::gemm_with(b, ta, false, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), N, 0.0f, C1.data(), N);
      // A second call from a different heap state and a shifted C gives the same bits.
      std::vector<float> shifted(size_t(M) * N + 3, 0.0f);
      k::gemm_with(b, ta, false, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), N, 0.0f, shifted.data() + 3,
                   N);
      std::copy(shifted.begin() + 3, shifted.end(), C2.begin());
      REQUIRE(std::memcmp(C1.data(), C2.data(), sizeof(float) * C1.size()) == 0);
    }
}

TEST_CASE("gemm_bias gives the bits of bias rows plus a beta = 1 gemm and never reads C", "[kernels][gemm]") {
  // Sizes around the micro-tile (14 x 32), the K block (384) and the N block (512).
  const int shapes[][3] = {{1, 1, 1}, {13, 31, 17}, {14, 32, 384}, {29, 65, 385}, {45, 530, 800}, {7, 3, 1}};
  for (GemmBackend b : available_backends())
    for (const auto& s : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const int M = s[0], N = s[1], K = s[2], ldc = N + 3;
          INFO("backend=" << k::gemm_backend_name(b) << " M=" << M << " N=" << N << " K=" << K << " ta=" << ta
                          << " tb=" << tb);
          const auto A = random_vec(size_t(M) * K, 21u + M), B = random_vec(size_t(K) * N, 22u + N);
          const auto bias = random_vec(size_t(N), 23u + K);
          const float sentinel = 12345.0f;
          std::vector<float> want(size_t(M) * ldc, sentinel), got(size_t(M) * ldc, sentinel);
          for (int i = 0; i < M; ++i) {
            std::copy(bias.begin(), bias.end(), want.begin() + size_t(i) * ldc);
            std::fill(got.begin() + size_t(i) * ldc, got.begin() + size_t(i) * ldc + N,
                      std::numeric_limits<float>::quiet_NaN());
          }
          k::gemm_with(b, ta, tb, M, N, K, 0.5f, A.data(), ta ? M : K, B.data(), tb ? K : N, 1.0f,
                       want.data(), ldc);
          k::gemm_bias_with(b, ta, tb, M, N, K, 0.5f, A.data(), ta ? M : K, B.data(), tb ? K : N, bias.data(),
                            got.data(), ldc);
          REQUIRE(std::memcmp(want.data(), got.data(), sizeof(float) * want.size()) == 0);
        }
}
