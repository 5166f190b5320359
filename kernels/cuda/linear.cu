// Fully connected layers through cuBLASLt: out = inp @ weight^T + bias, in f32 (TF32 when
// set) or with 16-bit operands and f32 accumulation (mixed precision). The bias is written
// into out first and the product added onto it (the CPU twin's gemm_bias); the bias
// gradient is a column sum in row order.
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/kernels.cuh"

namespace troupe::kernels::cuda {

namespace {

using detail::grid_for;
using detail::kThreads;
using detail::stream;

__global__ void k_fill_rows(float* out, const float* bias, int OC, size_t n) {
  TROUPE_GRID_STRIDE(i, n)
  out[i] = bias[i % OC];
}

void check(int N, int IC, int OC) {
  TROUPE_CHECK(N > 0 && IC > 0 && OC > 0, "N=", N, " IC=", IC, " OC=", OC);
}

void check_half(DType dt) {
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16, "linear: ", dtype_name(dt), " is not a 16-bit float");
}

// out(N,OC) = inp(N,IC) x weight(OC,IC)^T (+ bias)
void forward(DType dt, float* out, const void* inp, const void* weight, const float* bias, int N, int IC,
             int OC) {
  float beta = 0.0f;
  if (bias) {
    const size_t n = size_t(N) * OC;
    k_fill_rows<<<grid_for(n), kThreads, 0, stream()>>>(out, bias, OC, n);
    TROUPE_CUDA_LAUNCHED();
    beta = 1.0f;
  }
  detail::matmul(dt, false, true, N, OC, IC, inp, IC, weight, IC, beta, out, OC);
}

void backward(DType dt, float* dinp, float* dweight, const void* dout, const void* inp, const void* weight,
              int N, int IC, int OC, Out dinp_mode) {
  // dinp(N,IC) (+)= dout(N,OC) x weight(OC,IC)
  if (dinp)
    detail::matmul(dt, false, false, N, IC, OC, dout, OC, weight, IC,
                   dinp_mode == Out::overwrite ? 0.0f : 1.0f, dinp, IC);
  // dweight(OC,IC) += dout(N,OC)^T x inp(N,IC)
  if (dweight) detail::matmul(dt, true, false, OC, IC, N, dout, OC, inp, IC, 1.0f, dweight, IC);
}

}  // namespace

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                    int OC) {
  check(N, IC, OC);
  TROUPE_CHECK(out && inp && weight, "null tensor");
  forward(DType::f32, out, inp, weight, bias, N, IC, OC);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC, Out dinp_mode) {
  check(N, IC, OC);
  TROUPE_CHECK(dout && inp && weight, "null tensor");
  backward(DType::f32, dinp, dweight, dout, inp, weight, N, IC, OC, dinp_mode);
  if (dbias) detail::add_column_sums(dbias, dout, N, OC);
}

void linear_forward_h(DType dt, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias,
                      int N, int IC, int OC) {
  check_half(dt);
  check(N, IC, OC);
  TROUPE_CHECK(out && inp && weight, "null tensor");
  forward(dt, out, inp, weight, bias, N, IC, OC);
}

void linear_backward_h(DType dt, float* dinp, float* dweight, float* dbias, const float* dout,
                       uint16_t* dout_h, const uint16_t* inp, const uint16_t* weight, int N, int IC, int OC,
                       Out dinp_mode) {
  check_half(dt);
  check(N, IC, OC);
  TROUPE_CHECK(dout && dout_h && inp && weight, "null tensor");
  // The gradient enters the products in the compute dtype; the bias reduction keeps f32.
  to_half(dt, dout_h, dout, size_t(N) * OC);
  backward(dt, dinp, dweight, dout_h, inp, weight, N, IC, OC, dinp_mode);
  if (dbias) detail::add_column_sums(dbias, dout, N, OC);
}

}  // namespace troupe::kernels::cuda
