// Placeholder convert-only implementation of gemm_half.hpp (replaced by the full one).
#include "kernels/cpu/gemm_half.hpp"

#include <vector>

#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"

namespace troupe::kernels::cpu {

const char* half_gemm_backend_name(HalfGemmBackend b) { return b == HalfGemmBackend::convert ? "convert" : "avx512bf16"; }
bool half_gemm_backend_available(HalfGemmBackend b, DType dt) {
  return b == HalfGemmBackend::convert && (dt == DType::bf16 || dt == DType::f16);
}
HalfGemmBackend half_gemm_default_backend(DType) { return HalfGemmBackend::convert; }

void gemm_half_with(HalfGemmBackend, DType dt, bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda,
                    const uint16_t* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  const int ar = ta ? K : M, br = tb ? N : K;
  std::vector<float> a(size_t(ar) * lda), b(size_t(br) * ldb);
  from_half(dt, a.data(), A, a.size());
  from_half(dt, b.data(), B, b.size());
  if (bias)
    gemm_bias(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, bias, C, ldc);
  else
    gemm(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, beta, C, ldc);
}

void gemm_half(DType dt, bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
               int ldb, float beta, float* C, int ldc, const float* bias) {
  gemm_half_with(HalfGemmBackend::convert, dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
}

void to_half(DType dt, uint16_t* dst, const float* src, size_t n) { convert(DType::f32, src, dt, dst, n); }
void from_half(DType dt, float* dst, const uint16_t* src, size_t n) { convert(dt, src, DType::f32, dst, n); }

}  // namespace troupe::kernels::cpu
