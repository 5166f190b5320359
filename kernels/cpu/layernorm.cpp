// LayerNorm over the last dimension, PyTorch semantics: biased variance, eps inside the sqrt.
// Forward saves mean and rstd per row so the backward needs no second pass over statistics.
#include <cmath>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::kernels::cpu {

namespace {

constexpr float kEps = 1e-5f;

// One row: out, x, w, b are (C). Returns mean and rstd through the pointers.
TROUPE_VEC_CLONES void norm_row(float* __restrict__ out, float* mean_out, float* rstd_out,
                                const float* __restrict__ x, const float* __restrict__ w,
                                const float* __restrict__ b, int C) {
  const float mean = detail::lane_sum(x, C) / float(C);
  for (int c = 0; c < C; ++c) out[c] = x[c] - mean;
  // Centred second pass: no cancellation when |mean| >> std.
  const float var = detail::lane_dot(out, out, C) / float(C);
  const float rstd = 1.0f / std::sqrt(var + kEps);
  for (int c = 0; c < C; ++c) out[c] = out[c] * rstd * w[c] + b[c];
  *mean_out = mean;
  *rstd_out = rstd;
}

// With xhat = (x - mean) * rstd and g = dout * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw += dout * xhat,  db += dout.
TROUPE_VEC_CLONES void norm_row_backward(float* __restrict__ dx, float* __restrict__ dw,
                                         float* __restrict__ db, const float* __restrict__ dout,
                                         const float* __restrict__ x, const float* __restrict__ w, float mean,
                                         float rstd, int C) {
  if (dx) {
    float acc_g[detail::kLanes] = {}, acc_gx[detail::kLanes] = {};
    int c = 0;
    for (; c + detail::kLanes <= C; c += detail::kLanes)
      for (int j = 0; j < detail::kLanes; ++j) {
        const float g = dout[c + j] * w[c + j];
        acc_g[j] += g;
        acc_gx[j] += g * ((x[c + j] - mean) * rstd);
      }
    for (int j = 0; j < C - c && j < detail::kLanes; ++j) {
      const float g = dout[c + j] * w[c + j];
      acc_g[j] += g;
      acc_gx[j] += g * ((x[c + j] - mean) * rstd);
    }
    for (int s = detail::kLanes / 2; s > 0; s /= 2)
      for (int j = 0; j < s; ++j) {
        acc_g[j] += acc_g[j + s];
        acc_gx[j] += acc_gx[j + s];
      }
    const float g_mean = acc_g[0] / float(C), gx_mean = acc_gx[0] / float(C);
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - mean) * rstd;
      dx[c] += rstd * (dout[c] * w[c] - g_mean - xhat * gx_mean);
    }
  }
  if (dw)
    for (int c = 0; c < C; ++c) dw[c] += dout[c] * ((x[c] - mean) * rstd);
  if (db)
    for (int c = 0; c < C; ++c) db[c] += dout[c];
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  TROUPE_CHECK(N > 0 && C > 0, "N=", N, " C=", C);
  TROUPE_CHECK(out && mean && rstd && inp && weight && bias, "null tensor");
  for (int n = 0; n < N; ++n) {
    const size_t off = size_t(n) * C;
    norm_row(out + off, mean + n, rstd + n, inp + off, weight, bias, C);
  }
}

// dinp(N,C) +=, dweight(C) +=, dbias(C) +=; any of them may be null.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  TROUPE_CHECK(N > 0 && C > 0, "N=", N, " C=", C);
  TROUPE_CHECK(dout && inp && weight && mean && rstd, "null tensor");
  for (int n = 0; n < N; ++n) {
    const size_t off = size_t(n) * C;
    norm_row_backward(dinp ? dinp + off : nullptr, dweight, dbias, dout + off, inp + off, weight, mean[n],
                      rstd[n], C);
  }
}

}  // namespace troupe::kernels::cpu
