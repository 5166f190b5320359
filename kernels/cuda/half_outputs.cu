// The 16-bit-output forms of LayerNorm, RMSNorm, GELU and SwiGLU (kernels/cpu/half_outputs.cpp
// is the twin): the fp32 kernel into scratch from the caching allocator, then to_half, on the
// thread's stream; the bits of the two kernels in turn.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace troupe::kernels::cuda {

namespace {

void check_half(DType dt, const char* what) {
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16, what, ": ", dtype_name(dt), " is not a 16-bit float");
}

}  // namespace

void layernorm_forward_h(DType dt, uint16_t* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) {
  check_half(dt, "layernorm_forward_h");
  TROUPE_CHECK(N > 0 && C > 0, "layernorm: N=", N, " C=", C);
  detail::Scratch y(sizeof(float) * size_t(N) * C);
  layernorm_forward(y.as<float>(), mean, rstd, inp, weight, bias, N, C);
  to_half(dt, out, y.as<float>(), size_t(N) * C);
}

void rmsnorm_forward_h(DType dt, uint16_t* out, float* rstd, const float* inp, const float* weight, int N,
                       int C, float eps) {
  check_half(dt, "rmsnorm_forward_h");
  TROUPE_CHECK(N > 0 && C > 0, "rmsnorm: N=", N, " C=", C);
  detail::Scratch y(sizeof(float) * size_t(N) * C);
  rmsnorm_forward(y.as<float>(), rstd, inp, weight, N, C, eps);
  to_half(dt, out, y.as<float>(), size_t(N) * C);
}

void gelu_forward_h(DType dt, uint16_t* out, const float* inp, size_t n) {
  check_half(dt, "gelu_forward_h");
  if (n == 0) return;
  detail::Scratch y(sizeof(float) * n);
  gelu_forward(y.as<float>(), inp, n);
  to_half(dt, out, y.as<float>(), n);
}

void swiglu_forward_h(DType dt, uint16_t* out, const float* gu, int N, int F) {
  check_half(dt, "swiglu_forward_h");
  TROUPE_CHECK(N > 0 && F > 0, "swiglu: N=", N, " F=", F);
  detail::Scratch y(sizeof(float) * size_t(N) * F);
  swiglu_forward(y.as<float>(), gu, N, F);
  to_half(dt, out, y.as<float>(), size_t(N) * F);
}

}  // namespace troupe::kernels::cuda
