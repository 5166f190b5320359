// LayerNorm and RMSNorm: one block per row for the row statistics and the input gradient;
// the weight and bias gradients one thread per column, adding the rows in order onto what
// is there (the CPU twin's order: the same sequence of additions).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace troupe::kernels::cuda {

namespace {

using detail::kThreads;
using detail::stream;

constexpr float kEps = 1e-5f;

__global__ void k_layernorm_forward(float* out, float* mean_out, float* rstd_out, const float* inp,
                                    const float* w, const float* b, int C) {
  __shared__ float shared[kThreads];
  const size_t row = blockIdx.x;
  const float* x = inp + row * C;
  float* o = out + row * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
  const float mean = detail::block_reduce(s, shared, detail::Sum{}) / float(C);
  float ss = 0.0f;  // centred second pass
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = x[c] - mean;
    ss += d * d;
  }
  const float var = detail::block_reduce(ss, shared, detail::Sum{}) / float(C);
  const float rstd = 1.0f / sqrtf(var + kEps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = (x[c] - mean) * rstd * w[c] + b[c];
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * w.
__global__ void k_layernorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                                           const float* mean, const float* rstd, int C) {
  __shared__ float shared[kThreads];
  const size_t row = blockIdx.x;
  const float* d = dout + row * C;
  const float* x = inp + row * C;
  const float mu = mean[row], r = rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = d[c] * w[c];
    sg += g;
    sgx += g * ((x[c] - mu) * r);
  }
  const float g_mean = detail::block_reduce(sg, shared, detail::Sum{}) / float(C);
  const float gx_mean = detail::block_reduce(sgx, shared, detail::Sum{}) / float(C);
  float* dx = dinp + row * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (x[c] - mu) * r;
    dx[c] += r * (d[c] * w[c] - g_mean - xhat * gx_mean);
  }
}

__global__ void k_layernorm_backward_params(float* dw, float* db, const float* dout, const float* inp,
                                            const float* mean, const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float aw = dw ? dw[c] : 0.0f, ab = db ? db[c] : 0.0f;
  for (int n = 0; n < N; ++n) {
    const float d = dout[size_t(n) * C + c];
    aw += d * ((inp[size_t(n) * C + c] - mean[n]) * rstd[n]);
    ab += d;
  }
  if (dw) dw[c] = aw;
  if (db) db[c] = ab;
}

__global__ void k_rmsnorm_forward(float* out, float* rstd_out, const float* inp, const float* w, int C,
                                  float eps) {
  __shared__ float shared[kThreads];
  const size_t row = blockIdx.x;
  const float* x = inp + row * C;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
  const float r = 1.0f / sqrtf(detail::block_reduce(ss, shared, detail::Sum{}) / float(C) + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[row * C + c] = x[c] * r * w[c];
  if (threadIdx.x == 0) rstd_out[row] = r;
}

// dx += r * (w*g) - x * r^3 * mean(w*g*x).
__global__ void k_rmsnorm_backward_input(float* dinp, const float* dout, const float* inp, const float* w,
                                         const float* rstd, int C) {
  __shared__ float shared[kThreads];
  const size_t row = blockIdx.x;
  const float* g = dout + row * C;
  const float* x = inp + row * C;
  const float r = rstd[row];
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += w[c] * g[c] * x[c];
  const float k = detail::block_reduce(s, shared, detail::Sum{}) / float(C) * r * r * r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) dinp[row * C + c] += r * w[c] * g[c] - x[c] * k;
}

__global__ void k_rmsnorm_backward_weight(float* dw, const float* dout, const float* inp, const float* rstd,
                                          int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = dw[c];
  for (int n = 0; n < N; ++n) acc += dout[size_t(n) * C + c] * inp[size_t(n) * C + c] * rstd[n];
  dw[c] = acc;
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  TROUPE_CHECK(N > 0 && C > 0, "N=", N, " C=", C);
  TROUPE_CHECK(out && mean && rstd && inp && weight && bias, "null tensor");
  k_layernorm_forward<<<unsigned(N), kThreads, 0, stream()>>>(out, mean, rstd, inp, weight, bias, C);
  TROUPE_CUDA_LAUNCHED();
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  TROUPE_CHECK(N > 0 && C > 0, "N=", N, " C=", C);
  TROUPE_CHECK(dout && inp && weight && mean && rstd, "null tensor");
  if (dinp) {
    k_layernorm_backward_input<<<unsigned(N), kThreads, 0, stream()>>>(dinp, dout, inp, weight, mean, rstd,
                                                                       C);
    TROUPE_CUDA_LAUNCHED();
  }
  if (dweight || dbias) {
    k_layernorm_backward_params<<<detail::column_blocks(C), kThreads, 0, stream()>>>(dweight, dbias, dout,
                                                                                     inp, mean, rstd, N, C);
    TROUPE_CUDA_LAUNCHED();
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
  TROUPE_CHECK(N > 0 && C > 0 && eps > 0.0f, "rmsnorm: N=", N, " C=", C, " eps=", eps);
  TROUPE_CHECK(out && rstd && inp && weight, "null tensor");
  k_rmsnorm_forward<<<unsigned(N), kThreads, 0, stream()>>>(out, rstd, inp, weight, C, eps);
  TROUPE_CUDA_LAUNCHED();
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  TROUPE_CHECK(N > 0 && C > 0, "rmsnorm: N=", N, " C=", C);
  TROUPE_CHECK(dinp && dweight && dout && inp && weight && rstd, "null tensor");
  k_rmsnorm_backward_input<<<unsigned(N), kThreads, 0, stream()>>>(dinp, dout, inp, weight, rstd, C);
  TROUPE_CUDA_LAUNCHED();
  k_rmsnorm_backward_weight<<<detail::column_blocks(C), kThreads, 0, stream()>>>(dweight, dout, inp, rstd, N,
                                                                                 C);
  TROUPE_CUDA_LAUNCHED();
}

}  // namespace troupe::kernels::cuda
