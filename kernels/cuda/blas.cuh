// cuBLAS and cuBLASLt behind row-major calls shaped like kernels::cpu::gemm.
#pragma once

#include "kernels/cuda/common.cuh"

namespace troupe::kernels::cuda::detail {

// Row-major C(M,N) = alpha * op(A) * op(B) + beta * C (f32; TF32 when set_tf32), for `batch`
// products whose A, B and C lie strideA/B/C elements apart. cuBLAS, on this thread's stream.
void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                  long long stride_a, const float* B, int ldb, long long stride_b, float beta, float* C,
                  int ldc, long long stride_c, int batch);

// Row-major C(M,N) = op(A) * op(B) + beta * C through cuBLASLt, A and B of `ab` (f32, bf16
// or f16), C in f32, products accumulated in f32.
void matmul(DType ab, bool trans_a, bool trans_b, int M, int N, int K, const void* A, int lda, const void* B,
            int ldb, float beta, float* C, int ldc);

}  // namespace troupe::kernels::cuda::detail
