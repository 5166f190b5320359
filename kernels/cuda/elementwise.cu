// Element-wise kernels: GELU (tanh form), residual, add, scale, the 16-bit rounding of mixed
// precision, SwiGLU, rotary embeddings, AdamW, and the sum of squares of gradient clipping.
// Grid-stride loops over size_t indices. The formulas are the CPU twin's, in its order, but not
// bit for bit: nvcc fuses multiply-adds (the CPU build does not) and expf/tanhf are not the
// CPU's vectorized approximations. The 16-bit rounding is the same bits.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace troupe::kernels::cuda {

namespace {

using detail::grid_for;
using detail::kThreads;
using detail::stream;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ inline float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

// As kernels/cpu/gelu.cpp: sech^2 = 4E / (E + 1)^2, E = e^(2u).
__device__ inline float gelu_grad(float x) {
  const float e = expf(2.0f * kSqrt2OverPi * (x + kCubic * x * x * x));
  const float inv = 1.0f / (e + 1.0f);
  const float th = 1.0f - 2.0f * inv;
  const float sech2 = (e * inv) * (4.0f * inv);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
}

__global__ void k_gelu_forward(float* out, const float* inp, size_t n) {
  TROUPE_GRID_STRIDE(i, n) out[i] = gelu(inp[i]);
}
__global__ void k_gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  TROUPE_GRID_STRIDE(i, n) dinp[i] += gelu_grad(inp[i]) * dout[i];
}
__global__ void k_gelu_backward_inplace(float* d, const float* inp, size_t n) {
  TROUPE_GRID_STRIDE(i, n) d[i] = gelu_grad(inp[i]) * d[i];
}
__global__ void k_residual(float* out, const float* a, const float* b, size_t n) {
  TROUPE_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void k_add(float* y, const float* x, size_t n) { TROUPE_GRID_STRIDE(i, n) y[i] += x[i]; }
__global__ void k_scale(float* y, float s, size_t n) { TROUPE_GRID_STRIDE(i, n) y[i] *= s; }

// core/dtype_convert.hpp's f32_to_bf16 and f32_to_f16, bit for bit.
__device__ inline uint16_t to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ inline uint16_t to_f16(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  uint32_t keep, rest, half;
  if (a >= 0x38800000u) {
    keep = (a - 0x38000000u) >> 13;
    rest = a & 0x1fffu;
    half = 0x1000u;
  } else {
    if (a < 0x33000000u) return uint16_t(sign);
    const uint32_t shift = 126 - (a >> 23);
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    keep = m >> shift;
    rest = m & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  }
  if (rest > half || (rest == half && (keep & 1u))) ++keep;
  return uint16_t(sign | keep);
}

__global__ void k_to_bf16(uint16_t* dst, const float* src, size_t n) {
  TROUPE_GRID_STRIDE(i, n) dst[i] = to_bf16(src[i]);
}
__global__ void k_to_f16(uint16_t* dst, const float* src, size_t n) {
  TROUPE_GRID_STRIDE(i, n) dst[i] = to_f16(src[i]);
}

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// gu(N,2F): each row gate(F) | up(F); out(N,F).
__global__ void k_swiglu_forward(float* out, const float* gu, int N, int F) {
  TROUPE_GRID_STRIDE(i, size_t(N) * F) {
    const size_t n = i / F, f = i % F;
    const float g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
    out[i] = g * sigmoid(g) * u;
  }
}
__global__ void k_swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) {
  TROUPE_GRID_STRIDE(i, size_t(N) * F) {
    const size_t n = i / F, f = i % F;
    const float g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f], d = dout[i];
    const float s = sigmoid(g);
    dgu[n * 2 * F + F + f] = d * g * s;
    dgu[n * 2 * F + f] = d * u * s * (1.0f + g * (1.0f - s));
  }
}

// The inverse frequencies by value (a kernel argument, no device copy): head sizes up to 2 x
// kMaxRopePairs.
constexpr int kMaxRopePairs = 512;
struct RopeFreqs {
  float inv[kMaxRopePairs];
};

// One thread per (row, head, channel pair); the angle formed in f32 as kernels/cpu/llama.cpp
// forms it, its cosine and sine taken in double and rounded once.
__global__ void k_rope(float* x, int B, int T, int n_heads, int HS, int ld, RopeFreqs freqs, float sign) {
  const int half = HS / 2;
  TROUPE_GRID_STRIDE(j, size_t(B) * T * n_heads * half) {
    const int i = int(j % half);
    const size_t rest = j / half;
    const int h = int(rest % n_heads);
    const size_t row = rest / n_heads;  // b * T + t
    const int t = int(row % T);
    const float angle = float(t) * freqs.inv[i];
    const float c = float(cos(double(angle))), s = sign * float(sin(double(angle)));
    float* p = x + row * ld + size_t(h) * HS;
    const float a = p[i], e = p[i + half];
    p[i] = a * c - e * s;
    p[i + half] = e * c + a * s;
  }
}

__global__ void k_adamw(float* p, const float* g, float* m, float* v, size_t n, float decay, float beta1,
                        float beta2, float step_size, float bc2_sqrt, float eps) {
  // Each operation rounded on its own (no fused multiply-add), in the CPU kernel's order: the
  // same bits as kernels/cpu/adamw.cpp, which the CPU build compiles without contraction.
  const float one_minus_b1 = __fsub_rn(1.0f, beta1), one_minus_b2 = __fsub_rn(1.0f, beta2);
  TROUPE_GRID_STRIDE(i, n) {
    const float gi = g[i];
    const float pi = __fmul_rn(p[i], decay);
    const float mi = __fadd_rn(__fmul_rn(m[i], beta1), __fmul_rn(gi, one_minus_b1));
    const float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(gi, gi), one_minus_b2));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = __fsub_rn(pi, __fmul_rn(step_size, __fdiv_rn(mi, denom)));
  }
}

constexpr unsigned kSumBlocks = 256;  // fixed: the summation order depends on the size only

__global__ void k_sum_squares_partial(const float* x, size_t n, double* partial) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  TROUPE_GRID_STRIDE(i, n) acc += double(x[i]) * double(x[i]);
  const double s = detail::block_reduce(acc, shared, detail::Sum{});
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void k_sum_partials(const double* partial, unsigned count, double* out) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  const double s = detail::block_reduce(acc, shared, detail::Sum{});
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  TROUPE_CHECK(n == 0 || (out && inp), "null tensor");
  if (n == 0) return;
  k_gelu_forward<<<grid_for(n), kThreads, 0, stream()>>>(out, inp, n);
  TROUPE_CUDA_LAUNCHED();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  TROUPE_CHECK(n == 0 || (dinp && inp && dout), "null tensor");
  TROUPE_CHECK(n == 0 || (dinp != inp && dinp != dout), "dinp must not alias inp or dout");
  if (n == 0) return;
  k_gelu_backward<<<grid_for(n), kThreads, 0, stream()>>>(dinp, inp, dout, n);
  TROUPE_CUDA_LAUNCHED();
}

void gelu_backward_inplace(float* d, const float* inp, size_t n) {
  TROUPE_CHECK(n == 0 || (d && inp), "null tensor");
  TROUPE_CHECK(n == 0 || d != inp, "d must not alias inp");
  if (n == 0) return;
  k_gelu_backward_inplace<<<grid_for(n), kThreads, 0, stream()>>>(d, inp, n);
  TROUPE_CUDA_LAUNCHED();
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  TROUPE_CHECK(n == 0 || (out && a && b), "null tensor");
  if (n == 0) return;
  k_residual<<<grid_for(n), kThreads, 0, stream()>>>(out, a, b, n);
  TROUPE_CUDA_LAUNCHED();
}

void add_inplace(float* y, const float* x, size_t n) {
  TROUPE_CHECK(n == 0 || (y && x), "null tensor");
  if (n == 0) return;
  k_add<<<grid_for(n), kThreads, 0, stream()>>>(y, x, n);
  TROUPE_CUDA_LAUNCHED();
}

void scale_inplace(float* y, float s, size_t n) {
  TROUPE_CHECK(n == 0 || y, "null tensor");
  if (n == 0) return;
  k_scale<<<grid_for(n), kThreads, 0, stream()>>>(y, s, n);
  TROUPE_CUDA_LAUNCHED();
}

void to_half(DType dt, uint16_t* dst, const float* src, size_t n) {
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16, "to_half: ", dtype_name(dt), " is not a 16-bit float");
  TROUPE_CHECK(n == 0 || (dst && src), "null tensor");
  if (n == 0) return;
  if (dt == DType::bf16)
    k_to_bf16<<<grid_for(n), kThreads, 0, stream()>>>(dst, src, n);
  else
    k_to_f16<<<grid_for(n), kThreads, 0, stream()>>>(dst, src, n);
  TROUPE_CUDA_LAUNCHED();
}

void swiglu_forward(float* out, const float* gu, int N, int F) {
  TROUPE_CHECK(N > 0 && F > 0, "swiglu: N=", N, " F=", F);
  TROUPE_CHECK(out && gu, "null tensor");
  k_swiglu_forward<<<grid_for(size_t(N) * F), kThreads, 0, stream()>>>(out, gu, N, F);
  TROUPE_CUDA_LAUNCHED();
}

void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) {
  TROUPE_CHECK(N > 0 && F > 0, "swiglu: N=", N, " F=", F);
  TROUPE_CHECK(dgu && dout && gu, "null tensor");
  k_swiglu_backward<<<grid_for(size_t(N) * F), kThreads, 0, stream()>>>(dgu, dout, gu, N, F);
  TROUPE_CUDA_LAUNCHED();
}

namespace {
void rope_apply(float* x, int B, int T, int n_heads, int HS, int ld, const float* inv_freq, float sign) {
  TROUPE_CHECK(B > 0 && T > 0 && n_heads > 0 && HS > 0 && HS % 2 == 0 && ld >= n_heads * HS, "rope: B=", B,
               " T=", T, " heads=", n_heads, " HS=", HS, " ld=", ld);
  TROUPE_CHECK(x != nullptr && inv_freq != nullptr, "null tensor");
  TROUPE_CHECK(HS / 2 <= kMaxRopePairs, "rope on cuda: head size ", HS, " is above ", 2 * kMaxRopePairs);
  RopeFreqs freqs{};
  for (int i = 0; i < HS / 2; ++i) freqs.inv[i] = inv_freq[i];
  k_rope<<<grid_for(size_t(B) * T * n_heads * (HS / 2)), kThreads, 0, stream()>>>(x, B, T, n_heads, HS, ld,
                                                                                  freqs, sign);
  TROUPE_CUDA_LAUNCHED();
}
}  // namespace

void rope_forward(float* x, int B, int T, int n_heads, int HS, int ld, const float* inv_freq) {
  rope_apply(x, B, T, n_heads, HS, ld, inv_freq, 1.0f);
}

void rope_backward(float* dx, int B, int T, int n_heads, int HS, int ld, const float* inv_freq) {
  rope_apply(dx, B, T, n_heads, HS, ld, inv_freq, -1.0f);
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t) {
  const cpu::AdamWScalars s = cpu::adamw_scalars(lr, beta1, beta2, weight_decay, t);
  TROUPE_CHECK(n == 0 || (param && grad && m && v), "null tensor");
  if (n == 0) return;
  k_adamw<<<grid_for(n), kThreads, 0, stream()>>>(param, grad, m, v, n, s.decay, beta1, beta2, s.step_size,
                                                  s.bc2_sqrt, eps);
  TROUPE_CUDA_LAUNCHED();
}

double sum_squares(const float* x, size_t n) {
  TROUPE_CHECK(n == 0 || x, "null tensor");
  if (n == 0) return 0.0;
  detail::Scratch partial((kSumBlocks + 1) * sizeof(double));
  double* p = partial.as<double>();
  k_sum_squares_partial<<<kSumBlocks, kThreads, 0, stream()>>>(x, n, p);
  TROUPE_CUDA_LAUNCHED();
  k_sum_partials<<<1, kThreads, 0, stream()>>>(p, kSumBlocks, p + kSumBlocks);
  TROUPE_CUDA_LAUNCHED();
  double result = 0.0;
  TROUPE_CUDA_CHECK(
      cudaMemcpyAsync(&result, p + kSumBlocks, sizeof result, cudaMemcpyDeviceToHost, stream()));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return result;
}

}  // namespace troupe::kernels::cuda
