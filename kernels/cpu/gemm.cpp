// GEMM entry point. Row-major interface over a column-major BLAS: a row-major
// C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so operands swap.
#include <cblas.h>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"

namespace troupe::kernels::cpu {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  TROUPE_CHECK(M >= 0 && N >= 0 && K >= 0, "M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

const char* gemm_backend() { return "openblas"; }

}  // namespace troupe::kernels::cpu
