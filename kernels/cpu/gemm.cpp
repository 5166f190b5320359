// GEMM entry point: picks a backend once per process and forwards to it.
//
//  * avx512   our packed micro-kernel (gemm_avx512.cpp), on CPUs with AVX-512F.
//  * openblas row-major over a column-major BLAS: a row-major C = op(A) op(B) is
//             the column-major C^T = op(B)^T op(A)^T, so operands swap. Pinned to
//             one thread: one compute thread per worker is the project default.
//  * dnnl     oneDNN's dnnl_sgemm (row-major), when found at build time, with its
//             OpenMP runtime held to one thread on the calling thread.
//
// Each shape runs the backend measured fastest on it (gemm_dispatch.hpp);
// TROUPE_GEMM=avx512|openblas|dnnl forces one. Degenerate products (K == 0 or
// alpha == 0) never reach a backend, so C = beta * C is computed the same way
// everywhere and beta == 0 never reads C.
#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/error.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_backends.hpp"
#include "kernels/cpu/gemm_dispatch.hpp"
#include "kernels/cpu/kernels.hpp"

#ifdef TROUPE_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
// libgomp comes with libdnnl; declared here so that nothing else needs -fopenmp.
extern "C" void omp_set_num_threads(int);
#endif

namespace troupe::kernels::cpu {
namespace {

void openblas_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc) {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#ifdef TROUPE_HAVE_DNNL
void dnnl_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
  // OpenMP's thread count is per calling thread.
  thread_local bool pinned = false;
  if (!pinned) {
    omp_set_num_threads(1);
    pinned = true;
  }
  const dnnl_status_t st =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  TROUPE_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", int(st));
}
#endif

// C(M,N) = beta * C, never reading C when beta == 0.
void scale_c(int M, int N, float beta, float* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    float* row = C + static_cast<long>(i) * ldc;
    if (beta == 0.0f)
      std::memset(row, 0, sizeof(float) * N);
    else
      for (int j = 0; j < N; ++j) row[j] *= beta;
  }
}

// C(M,N) rows = bias(N).
void fill_rows(int M, int N, const float* bias, float* C, int ldc) {
  for (int i = 0; i < M; ++i) std::memcpy(C + static_cast<long>(i) * ldc, bias, sizeof(float) * N);
}

void check_args(GemmBackend b, bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb, int ldc) {
  TROUPE_CHECK(M >= 0 && N >= 0 && K >= 0, "M=", M, " N=", N, " K=", K);
  TROUPE_CHECK(lda >= (trans_a ? (M > 0 ? M : 1) : (K > 0 ? K : 1)), "lda=", lda, " too small");
  TROUPE_CHECK(ldb >= (trans_b ? (K > 0 ? K : 1) : (N > 0 ? N : 1)), "ldb=", ldb, " too small");
  TROUPE_CHECK(ldc >= (N > 0 ? N : 1), "ldc=", ldc, " too small");
  TROUPE_CHECK(gemm_backend_available(b), "GEMM backend ", gemm_backend_name(b), " is not available");
}

GemmBackend choose_backend() {
  const char* env = std::getenv("TROUPE_GEMM");
  if (env == nullptr || *env == '\0')
    return gemm_backend_available(GemmBackend::avx512) ? GemmBackend::avx512 : GemmBackend::openblas;
  for (GemmBackend b : {GemmBackend::avx512, GemmBackend::openblas, GemmBackend::dnnl}) {
    if (std::strcmp(env, gemm_backend_name(b)) == 0) {
      TROUPE_CHECK(gemm_backend_available(b), "TROUPE_GEMM=", env, " is not available on this machine/build");
      return b;
    }
  }
  TROUPE_CHECK(false, "TROUPE_GEMM=", env, " is not one of avx512, openblas, dnnl");
  return GemmBackend::openblas;
}

}  // namespace

const char* gemm_backend_name(GemmBackend b) {
  switch (b) {
    case GemmBackend::avx512:
      return "avx512";
    case GemmBackend::openblas:
      return "openblas";
    case GemmBackend::dnnl:
      return "dnnl";
  }
  return "?";
}

bool gemm_backend_available(GemmBackend b) {
  switch (b) {
    case GemmBackend::avx512:
      return cpu_features().avx512;
    case GemmBackend::openblas:
      return true;
    case GemmBackend::dnnl:
#ifdef TROUPE_HAVE_DNNL
      return true;
#else
      return false;
#endif
  }
  return false;
}

GemmBackend gemm_default_backend() {
  static const GemmBackend b = choose_backend();
  return b;
}

void gemm_with(GemmBackend b, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
               int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  check_args(b, trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  switch (b) {
    case GemmBackend::avx512:
      detail::gemm_avx512(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    case GemmBackend::openblas:
      openblas_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    case GemmBackend::dnnl:
#ifdef TROUPE_HAVE_DNNL
      dnnl_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
      return;
  }
}

void gemm_bias_with(GemmBackend b, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                    const float* A, int lda, const float* B, int ldb, const float* bias, float* C, int ldc) {
  check_args(b, trans_a, trans_b, M, N, K, lda, ldb, ldc);
  TROUPE_CHECK(bias != nullptr || M == 0 || N == 0, "gemm_bias without a bias");
  if (M == 0 || N == 0) return;
  if (b == GemmBackend::avx512 && K > 0 && alpha != 0.0f) {
    detail::gemm_avx512(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc, bias);
    return;
  }
  // The other backends take C as the bias rows and accumulate onto it.
  fill_rows(M, N, bias, C, ldc);
  gemm_with(b, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc);
}

namespace {
GemmBackend dispatched(bool trans_a, bool trans_b, int M, int N, int K) {
  return static_cast<GemmBackend>(gemm_dispatch(DType::f32, trans_a, trans_b, M, N, K));
}
}  // namespace

void gemm_bias(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, const float* bias, float* C, int ldc) {
  gemm_bias_with(dispatched(trans_a, trans_b, M, N, K), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb,
                 bias, C, ldc);
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  gemm_with(dispatched(trans_a, trans_b, M, N, K), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
            ldc);
}

const char* gemm_backend() {
  if (const char* env = std::getenv("TROUPE_GEMM"); env != nullptr && *env != '\0')
    return gemm_backend_name(gemm_default_backend());
  static const std::string measured = [] {
    std::string s = "measured per shape:";
    for (GemmBackend b : {GemmBackend::avx512, GemmBackend::dnnl, GemmBackend::openblas})
      if (gemm_backend_available(b)) s += std::string(" ") + gemm_backend_name(b);
    return s;
  }();
  return measured.c_str();
}

}  // namespace troupe::kernels::cpu
