// Fully connected layer, PyTorch convention: weight is (OC,IC), out = inp @ weight^T + bias.
// The products go through gemm(); only the bias broadcast and its reduction are loops here.
#include "core/error.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"

namespace troupe::kernels::cpu {

namespace {

// dbias(OC) += sum over rows of dout(N,OC); rows outer so the inner loop is contiguous.
void sum_rows(float* __restrict__ dbias, const float* __restrict__ dout, int N, int OC) {
  for (int n = 0; n < N; ++n) {
    const float* __restrict__ row = dout + size_t(n) * OC;
    for (int o = 0; o < OC; ++o) dbias[o] += row[o];
  }
}

}  // namespace

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                    int OC) {
  TROUPE_CHECK(N > 0 && IC > 0 && OC > 0, "N=", N, " IC=", IC, " OC=", OC);
  TROUPE_CHECK(out && inp && weight, "null tensor");
  // (N,IC) x (OC,IC)^T -> (N,OC), the bias added as each tile is stored
  if (bias)
    gemm_bias(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, bias, out, OC);
  else
    gemm(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f, out, OC);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC, Out dinp_mode) {
  TROUPE_CHECK(N > 0 && IC > 0 && OC > 0, "N=", N, " IC=", IC, " OC=", OC);
  TROUPE_CHECK(dout && inp && weight, "null tensor");
  // dinp(N,IC) (+)= dout(N,OC) x weight(OC,IC)
  if (dinp)
    gemm(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, dinp_mode == Out::overwrite ? 0.0f : 1.0f, dinp,
         IC);
  // dweight(OC,IC) += dout(N,OC)^T x inp(N,IC)
  if (dweight) gemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias) sum_rows(dbias, dout, N, OC);
}

void linear_forward_h(DType dt, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias,
                      int N, int IC, int OC) {
  TROUPE_CHECK(N > 0 && IC > 0 && OC > 0, "N=", N, " IC=", IC, " OC=", OC);
  TROUPE_CHECK(out && inp && weight, "null tensor");
  gemm_half(dt, false, true, N, OC, IC, inp, IC, weight, IC, 0.0f, out, OC, bias);
}

void linear_backward_h(DType dt, float* dinp, float* dweight, float* dbias, const float* dout,
                       uint16_t* dout_h, const uint16_t* inp, const uint16_t* weight, int N, int IC, int OC,
                       Out dinp_mode) {
  TROUPE_CHECK(N > 0 && IC > 0 && OC > 0, "N=", N, " IC=", IC, " OC=", OC);
  TROUPE_CHECK(dout && dout_h && inp && weight, "null tensor");
  // The gradient enters the products in the compute dtype, as the gradient of a 16-bit
  // output does under torch.autocast; the bias reduction keeps its f32 values.
  to_half(dt, dout_h, dout, size_t(N) * OC);
  if (dinp)
    gemm_half(dt, false, false, N, IC, OC, dout_h, OC, weight, IC, dinp_mode == Out::overwrite ? 0.0f : 1.0f,
              dinp, IC);
  if (dweight) gemm_half(dt, true, false, OC, IC, N, dout_h, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias) sum_rows(dbias, dout, N, OC);
}

}  // namespace troupe::kernels::cpu
