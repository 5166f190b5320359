// GEMM backends behind kernels::cpu::gemm, for tests and benchmarks that compare
// them in one process. Everything else calls gemm() and lets it pick.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.hpp"

namespace troupe::kernels::cpu {

enum class GemmBackend { avx512, openblas, dnnl };

// "avx512", "openblas" or "dnnl" (the names TROUPE_GEMM accepts).
const char* gemm_backend_name(GemmBackend b);

// avx512: this CPU runs AVX-512 (cpu_features.hpp, after TROUPE_MAX_CPU_ISA); dnnl: oneDNN
// was found at build time; openblas: always.
bool gemm_backend_available(GemmBackend b);

// The static choice: TROUPE_GEMM when set (an unknown or unavailable name throws
// troupe::Error), otherwise avx512 where available, else openblas. gemm() runs it when
// TROUPE_GEMM is set and for products too small to measure; otherwise the backend measured
// fastest on the shape (gemm_dispatch.hpp).
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

// The onednn backend of gemm_half (gemm_onednn.cpp, builds with oneDNN only): oneDNN's
// implementation for dt on this CPU ("brg:avx512_core_amx", "ref:any"; "" when it has none),
// whether it is one worth running (not the reference loop), and the product itself (same
// contract as gemm_half_with; M, N, K > 0).
const std::string& onednn_half_impl(DType dt);
bool onednn_half_usable(DType dt);
void gemm_half_onednn(DType dt, bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
                      const uint16_t* B, int ldb, float beta, float* C, int ldc, const float* bias);
}  // namespace detail

}  // namespace troupe::kernels::cpu
