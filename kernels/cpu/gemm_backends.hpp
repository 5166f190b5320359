// GEMM backends behind kernels::cpu::gemm, for tests and benchmarks that compare
// them in one process. Everything else calls gemm() and lets it pick.
#pragma once

namespace troupe::kernels::cpu {

enum class GemmBackend { avx512, openblas, dnnl };

// "avx512", "openblas" or "dnnl" (the names TROUPE_GEMM accepts).
const char* gemm_backend_name(GemmBackend b);

// avx512: this CPU and OS run AVX-512F code; dnnl: oneDNN was found at build time;
// openblas: always.
bool gemm_backend_available(GemmBackend b);

// The backend gemm() uses: TROUPE_GEMM when set (an unknown or unavailable name
// throws troupe::Error), otherwise avx512 where available, else openblas.
GemmBackend gemm_default_backend();

// Same contract as gemm(), through backend b (which must be available).
void gemm_with(GemmBackend b, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
               int lda, const float* B, int ldb, float beta, float* C, int ldc);

// Same contract as gemm_bias(), through backend b.
void gemm_bias_with(GemmBackend b, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                    const float* A, int lda, const float* B, int ldb, const float* bias, float* C, int ldc);

namespace detail {
// The AVX-512 path (gemm_avx512.cpp). Requires AVX-512F; expects M, N, K > 0 and
// alpha != 0 (gemm_with handles the degenerate cases for every backend).
// bias (N), when given, requires beta == 0: C = alpha * op(A) op(B) + bias per column.
void gemm_avx512(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc, const float* bias = nullptr);
}  // namespace detail

}  // namespace troupe::kernels::cpu
