// The handles (one cuBLAS and one cuBLASLt handle per thread, created on first use and kept
// for the thread's life) and the row-major wrappers of blas.cuh. A row-major matrix is the
// column-major transpose of itself, so row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T: the operands swap, the transposes stay.
#include <initializer_list>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/blas.cuh"

namespace troupe::kernels::cuda::detail {

namespace {

cublasHandle_t blas() {
  thread_local cublasHandle_t h = nullptr;  // never destroyed: the runtime may be gone at thread exit
  if (h == nullptr) TROUPE_CUBLAS_CHECK(cublasCreate(&h));
  TROUPE_CUBLAS_CHECK(cublasSetStream(h, stream()));
  TROUPE_CUBLAS_CHECK(cublasSetMathMode(h, tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return h;
}

cublasLtHandle_t lt() {
  thread_local cublasLtHandle_t h = nullptr;
  if (h == nullptr) TROUPE_CUBLAS_CHECK(cublasLtCreate(&h));
  return h;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      TROUPE_CHECK(false, "matmul: operands of ", dtype_name(t), " are not supported (f32, bf16, f16)");
  }
  return CUDA_R_32F;
}

// The descriptors and the heuristic's algorithm of one matmul shape, made once per thread
// and shape (the heuristic is the slow part of a call) and kept for the thread's life.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Everything a plan depends on.
using LtKey = std::tuple<DType, bool, bool, int, int, int, int, int, int, uint32_t, bool>;

// 16 when every operand is 16-byte aligned, else the smallest element size among them (C is
// f32). The same answer for every buffer of the same alignment class.
uint32_t operand_alignment(std::initializer_list<const void*> ptrs, DType ab) {
  bool all16 = true;
  for (const void* p : ptrs) all16 = all16 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  return all16 ? 16u : uint32_t(std::min<size_t>(dtype_size(ab), 4));
}

constexpr size_t kLtWorkspace = size_t{32} << 20;  // what NVIDIA suggests for Hopper

std::unique_ptr<LtPlan> make_plan(DType ab, bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb,
                                  int ldc, uint32_t align, bool fast) {
  const cudaDataType_t t = cuda_type(ab);
  auto plan = std::make_unique<LtPlan>();
  TROUPE_CUBLAS_CHECK(cublasLtMatmulDescCreate(
      &plan->op, fast ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major: C^T(N,M) = op(B)^T(N,K) op(A)^T(K,M); first operand B, second A.
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TROUPE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
  TROUPE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
  // Stored column-major shapes: B^T as stored is (trans_b ? K x N : N x K) rows x cols, ld ldb.
  TROUPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, t, trans_b ? K : N, trans_b ? N : K, ldb));
  TROUPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, t, trans_a ? M : K, trans_a ? K : M, lda));
  TROUPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, N, M, ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  TROUPE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  decltype(&cublasLtMatmulPreferenceDestroy)>
      own_pref(pref, &cublasLtMatmulPreferenceDestroy);
  size_t ws = kLtWorkspace;
  TROUPE_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  // The heuristic assumes 256-byte aligned operands unless told otherwise; weights and
  // activations are slices of larger buffers. A fixed promise (16 bytes, else one element)
  // keeps the algorithm, hence the bits, independent of where the allocator put a buffer.
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    TROUPE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align));
  int found = 0;
  TROUPE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt(), plan->op, plan->a, plan->b, plan->c, plan->c, pref,
                                                     1, &plan->result, &found));
  TROUPE_CHECK(found > 0, "cuBLASLt has no algorithm for ", dtype_name(ab), " M=", M, " N=", N, " K=", K,
               " lda=", lda, " ldb=", ldb, " ldc=", ldc);
  return plan;
}

}  // namespace

void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                  long long stride_a, const float* B, int ldb, long long stride_b, float beta, float* C,
                  int ldc, long long stride_c, int batch) {
  TROUPE_CHECK(M > 0 && N > 0 && K > 0 && batch > 0, "gemm: M=", M, " N=", N, " K=", K, " batch=", batch);
  TROUPE_CUBLAS_CHECK(cublasSgemmStridedBatched(blas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                                                stride_b, A, lda, stride_a, &beta, C, ldc, stride_c, batch));
}

void matmul(DType ab, bool trans_a, bool trans_b, int M, int N, int K, const void* A, int lda, const void* B,
            int ldb, float beta, float* C, int ldc) {
  TROUPE_CHECK(M > 0 && N > 0 && K > 0, "matmul: M=", M, " N=", N, " K=", K);
  const uint32_t align = operand_alignment({A, B, C}, ab);
  const bool fast = ab == DType::f32 && tf32();
  thread_local std::map<LtKey, std::unique_ptr<LtPlan>> plans;
  std::unique_ptr<LtPlan>& slot = plans[LtKey{ab, trans_a, trans_b, M, N, K, lda, ldb, ldc, align, fast}];
  if (!slot) slot = make_plan(ab, trans_a, trans_b, M, N, K, lda, ldb, ldc, align, fast);
  const LtPlan& plan = *slot;
  const cublasLtMatmulHeuristicResult_t& result = plan.result;
  Scratch workspace(result.workspaceSize > 0 ? result.workspaceSize : 1);
  const float alpha = 1.0f;
  TROUPE_CUBLAS_CHECK(cublasLtMatmul(lt(), plan.op, &alpha, B, plan.a, A, plan.b, &beta, C, plan.c, C, plan.c,
                                     &result.algo, workspace.as<void>(), result.workspaceSize, stream()));
}

}  // namespace troupe::kernels::cuda::detail
