// GELU, tanh approximation (PyTorch approximate='tanh'):
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
// tanh comes from detail::tanh_approx so both loops vectorize.
#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::kernels::cpu {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

TROUPE_VEC_CLONES void gelu_loop(float* __restrict__ out, const float* __restrict__ inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float th = detail::tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x));
    out[i] = 0.5f * x * (1.0f + th);
  }
}

// The same loop without the no-alias promise: each element is read before it is written.
TROUPE_VEC_CLONES void gelu_inplace_loop(float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = y[i];
    y[i] = 0.5f * x * (1.0f + detail::tanh_approx(kSqrt2OverPi * (x + kCubic * x * x * x)));
  }
}

// dgelu/dx = 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// sech^2 = 4E / (E + 1)^2 with E = e^(2u), not 1 - tanh^2: the latter keeps a float rounding
// residue of ~1e-7 for large u, which the x^3 growth of x du/dx would blow up.
inline float gelu_grad(float x) {
  const float e = detail::exp_approx(2.0f * kSqrt2OverPi * (x + kCubic * x * x * x));
  const float inv = 1.0f / (e + 1.0f);
  const float th = 1.0f - 2.0f * inv;
  const float sech2 = (e * inv) * (4.0f * inv);  // this order: 4e alone overflows at e = e^88
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
}

TROUPE_VEC_CLONES void gelu_backward_loop(float* __restrict__ dinp, const float* __restrict__ inp,
                                          const float* __restrict__ dout, size_t n) {
  for (size_t i = 0; i < n; ++i) dinp[i] += gelu_grad(inp[i]) * dout[i];
}

TROUPE_VEC_CLONES void gelu_backward_inplace_loop(float* __restrict__ d, const float* __restrict__ inp,
                                                  size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = gelu_grad(inp[i]) * d[i];
}

}  // namespace

// out(n) = gelu(inp(n)). out == inp (in place) is allowed.
void gelu_forward(float* out, const float* inp, size_t n) {
  TROUPE_CHECK(n == 0 || (out && inp), "null tensor");
  if (out == inp)
    gelu_inplace_loop(out, n);
  else
    gelu_loop(out, inp, n);
}

// dinp(n) += gelu'(inp) * dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  TROUPE_CHECK(n == 0 || (dinp && inp && dout), "null tensor");
  TROUPE_CHECK(n == 0 || (dinp != inp && dinp != dout), "dinp must not alias inp or dout");
  gelu_backward_loop(dinp, inp, dout, n);
}

// d(n) = gelu'(inp) * d.
void gelu_backward_inplace(float* d, const float* inp, size_t n) {
  TROUPE_CHECK(n == 0 || (d && inp), "null tensor");
  TROUPE_CHECK(n == 0 || d != inp, "d must not alias inp");
  gelu_backward_inplace_loop(d, inp, n);
}

}  // namespace troupe::kernels::cpu
