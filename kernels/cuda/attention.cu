// Fused causal (grouped-query) attention, the CUDA twin of kernels/cpu/flash_attention.cpp:
// nothing of size T x T is stored; the forward keeps each query's log-sum-exp and the
// backward recomputes the probabilities from it.
//
// One warp per row: a query row in the forward and in the dq kernel, a key row (of one
// key/value head, over its group's query heads in order) in the dk/dv kernel, so that every
// sum has one fixed order (the same bits every run, no atomics). Each lane holds head
// channels lane, lane + 32, ... (HS <= 256). Scores are warp sums reduced down to lane 0 and
// broadcast, so every lane sees the same bits.
//
//   forward   for keys j <= t:  s = q.k_j * scale;  m' = max(m, s);
//             acc = acc e^(m - m') + e^(s - m') v_j;  l = l e^(m - m') + e^(s - m')
//             out = acc / l, lse = m + log l
//   D         D(t) = dout(t) . out(t)
//   dq        for keys j <= t:  p = e^(q.k_j * scale - lse);  dS = p (dout.v_j - D) * scale;  dq += dS k_j
//   dk, dv    for heads of the group, queries t >= j:  dv += p dout_t;  dk += dS q_t
// In 16 bits q, k, v and out are bf16 / f16, the probabilities, dout and dS are rounded to
// 16 bits where the CPU twin's products read them, and every sum is f32.
//
// These kernels keep memory O(T) and their results equal the CPU twin's up to summation
// order; they are SIMT code, without shared-memory tiles or tensor-core MMAs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace troupe::kernels::cuda {

namespace {

using detail::stream;

constexpr int kMaxChunks = 8;  // HS <= 32 * kMaxChunks
constexpr int kRowsPerBlock = 4;

struct F32 {
  using T = float;
  __device__ static float load(const float* p, size_t i) { return p[i]; }
  __device__ static float round(float x) { return x; }
  __device__ static void store(float* p, size_t i, float x) { p[i] = x; }
};
struct BF16 {
  using T = uint16_t;
  __device__ static float load(const uint16_t* p, size_t i) { return __uint_as_float(uint32_t(p[i]) << 16); }
  __device__ static uint16_t bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
  __device__ static float round(float x) { return __uint_as_float(uint32_t(bits(x)) << 16); }
  __device__ static void store(uint16_t* p, size_t i, float x) { p[i] = bits(x); }
};
struct F16 {
  using T = uint16_t;
  __device__ static float load(const uint16_t* p, size_t i) { return __half2float(__ushort_as_half(p[i])); }
  __device__ static uint16_t bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
  __device__ static float round(float x) { return __half2float(__ushort_as_half(bits(x))); }
  __device__ static void store(uint16_t* p, size_t i, float x) { p[i] = bits(x); }
};

// The warp's sum of v, reduced toward lane 0 in a fixed order and broadcast from it.
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return __shfl_sync(0xffffffffu, v, 0);
}

struct Dims {
  int B, T, NH, HS, NKV, C, CKV, ld, group;
  float scale;
};

template <class E>
__device__ void load_row(float* r, const typename E::T* p, int HS, int lane) {
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int d = lane + 32 * c;
    r[c] = d < HS ? E::load(p, size_t(d)) : 0.0f;
  }
}

template <class E>
__device__ float dot_row(const float* r, const typename E::T* p, int HS, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int d = lane + 32 * c;
    if (d < HS) s += r[c] * E::load(p, size_t(d));
  }
  return warp_sum(s);
}

template <class E>
__global__ void k_forward(typename E::T* out, float* lse, const typename E::T* qkv, Dims d) {
  const int lane = threadIdx.x % 32, t = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int h = blockIdx.y, b = blockIdx.z;
  if (t >= d.T) return;
  const typename E::T* k0 = qkv + size_t(b) * d.T * d.ld + d.C + size_t(h / d.group) * d.HS;
  float q[kMaxChunks], acc[kMaxChunks];
  load_row<E>(q, qkv + (size_t(b) * d.T + t) * d.ld + size_t(h) * d.HS, d.HS, lane);
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) acc[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= t; ++j) {
    const typename E::T* kj = k0 + size_t(j) * d.ld;
    const float s = dot_row<E>(q, kj, d.HS, lane) * d.scale;
    const float mn = fmaxf(m, s);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - mn), p = expf(s - mn), pv = E::round(p);
    l = l * alpha + p;
    m = mn;
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c) {
      const int dd = lane + 32 * c;
      if (dd < d.HS) acc[c] = acc[c] * alpha + pv * E::load(kj + d.CKV, size_t(dd));
    }
  }
  typename E::T* o = out + (size_t(b) * d.T + t) * d.C + size_t(h) * d.HS;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int dd = lane + 32 * c;
    if (dd < d.HS) E::store(o, size_t(dd), acc[c] / l);
  }
  if (lane == 0) lse[(size_t(b) * d.NH + h) * d.T + t] = m + logf(l);
}

// D(b,h,t) = dout(t) . out(t), out widened from E.
template <class E>
__global__ void k_dout_dot_out(float* D, const float* dout, const typename E::T* out, Dims d) {
  const int lane = threadIdx.x % 32, t = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int h = blockIdx.y, b = blockIdx.z;
  if (t >= d.T) return;
  const size_t row = (size_t(b) * d.T + t) * d.C + size_t(h) * d.HS;
  float s = 0.0f;
  for (int dd = lane; dd < d.HS; dd += 32) s += dout[row + dd] * E::load(out + row, size_t(dd));
  s = warp_sum(s);
  if (lane == 0) D[(size_t(b) * d.NH + h) * d.T + t] = s;
}

template <class E>
__global__ void k_dq(float* dqkv, const float* dout, const typename E::T* qkv, const float* lse,
                     const float* D, Dims d, float beta) {
  const int lane = threadIdx.x % 32, t = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int h = blockIdx.y, b = blockIdx.z;
  if (t >= d.T) return;
  const size_t qrow = (size_t(b) * d.T + t) * d.ld + size_t(h) * d.HS;
  const typename E::T* k0 = qkv + size_t(b) * d.T * d.ld + d.C + size_t(h / d.group) * d.HS;
  const size_t stat = (size_t(b) * d.NH + h) * d.T + t;
  float q[kMaxChunks], g[kMaxChunks], dq[kMaxChunks];
  load_row<E>(q, qkv + qrow, d.HS, lane);
  const float* grow = dout + (size_t(b) * d.T + t) * d.C + size_t(h) * d.HS;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int dd = lane + 32 * c;
    g[c] = dd < d.HS ? E::round(grow[dd]) : 0.0f;
    dq[c] = 0.0f;
  }
  const float L = lse[stat], Dt = D[stat];
  for (int j = 0; j <= t; ++j) {
    const typename E::T* kj = k0 + size_t(j) * d.ld;
    const float p = expf(dot_row<E>(q, kj, d.HS, lane) * d.scale - L);
    const float dp = dot_row<E>(g, kj + d.CKV, d.HS, lane);
    const float ds = E::round(p * (dp - Dt) * d.scale);
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c) {
      const int dd = lane + 32 * c;
      if (dd < d.HS) dq[c] += ds * E::load(kj, size_t(dd));
    }
  }
  float* o = dqkv + qrow;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int dd = lane + 32 * c;
    if (dd < d.HS) o[dd] = beta == 0.0f ? dq[c] : o[dd] + dq[c];  // overwrite never reads
  }
}

// One warp per key row j of key/value head blockIdx.y, over the group's query heads in order.
template <class E>
__global__ void k_dkdv(float* dqkv, const float* dout, const typename E::T* qkv, const float* lse,
                       const float* D, Dims d, float beta) {
  const int lane = threadIdx.x % 32, j = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  const int g = blockIdx.y, b = blockIdx.z;
  if (j >= d.T) return;
  const size_t krow = (size_t(b) * d.T + j) * d.ld + d.C + size_t(g) * d.HS;
  float k[kMaxChunks], v[kMaxChunks], dk[kMaxChunks], dv[kMaxChunks];
  load_row<E>(k, qkv + krow, d.HS, lane);
  load_row<E>(v, qkv + krow + d.CKV, d.HS, lane);
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) dk[c] = dv[c] = 0.0f;
  for (int h = g * d.group; h < (g + 1) * d.group; ++h)
    for (int t = j; t < d.T; ++t) {
      const typename E::T* qt = qkv + (size_t(b) * d.T + t) * d.ld + size_t(h) * d.HS;
      const float* gt = dout + (size_t(b) * d.T + t) * d.C + size_t(h) * d.HS;
      const size_t stat = (size_t(b) * d.NH + h) * d.T + t;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        const int dd = lane + 32 * c;
        if (dd < d.HS) {
          s += k[c] * E::load(qt, size_t(dd));
          dp += E::round(gt[dd]) * v[c];
        }
      }
      s = warp_sum(s);
      dp = warp_sum(dp);
      const float p = expf(s * d.scale - lse[stat]);
      const float pr = E::round(p), ds = E::round(p * (dp - D[stat]) * d.scale);
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        const int dd = lane + 32 * c;
        if (dd < d.HS) {
          dv[c] += pr * E::round(gt[dd]);
          dk[c] += ds * E::load(qt, size_t(dd));
        }
      }
    }
  float* ok = dqkv + krow;
  float* ov = ok + d.CKV;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int dd = lane + 32 * c;
    if (dd < d.HS) {
      ok[dd] = beta == 0.0f ? dk[c] : ok[dd] + dk[c];
      ov[dd] = beta == 0.0f ? dv[c] : ov[dd] + dv[c];
    }
  }
}

Dims dims(int B, int T, int NH, int HS, int NKV) {
  NKV = cpu::attention_kv_heads(B, T, NH, HS, NKV);
  TROUPE_CHECK(HS <= 32 * kMaxChunks, "attention: head size ", HS, " is over ", 32 * kMaxChunks);
  TROUPE_CHECK(NH <= 65535 && B <= 65535, "attention: ", B, " rows of ", NH,
               " heads is over the grid's limit");
  const int C = NH * HS, CKV = NKV * HS;
  return {B, T, NH, HS, NKV, C, CKV, C + 2 * CKV, NH / NKV, 1.0f / std::sqrt(float(HS))};
}

dim3 rows_grid(const Dims& d, int heads) {
  return dim3(unsigned((d.T + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(heads), unsigned(d.B));
}

template <class E>
void forward(typename E::T* out, float* lse, const typename E::T* qkv, const Dims& d) {
  k_forward<E><<<rows_grid(d, d.NH), 32 * kRowsPerBlock, 0, stream()>>>(out, lse, qkv, d);
  TROUPE_CUDA_LAUNCHED();
}

template <class E>
void backward(float* dqkv, const float* dout, const typename E::T* qkv, const typename E::T* out,
              const float* lse, const Dims& d, Out mode) {
  detail::Scratch D(sizeof(float) * size_t(d.B) * d.NH * d.T);
  k_dout_dot_out<E><<<rows_grid(d, d.NH), 32 * kRowsPerBlock, 0, stream()>>>(D.as<float>(), dout, out, d);
  TROUPE_CUDA_LAUNCHED();
  const float beta = mode == Out::overwrite ? 0.0f : 1.0f;
  k_dq<E>
      <<<rows_grid(d, d.NH), 32 * kRowsPerBlock, 0, stream()>>>(dqkv, dout, qkv, lse, D.as<float>(), d, beta);
  TROUPE_CUDA_LAUNCHED();
  k_dkdv<E><<<rows_grid(d, d.NKV), 32 * kRowsPerBlock, 0, stream()>>>(dqkv, dout, qkv, lse, D.as<float>(), d,
                                                                      beta);
  TROUPE_CUDA_LAUNCHED();
}

void check_half(DType dt) {
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16, "attention: ", dtype_name(dt),
               " is not a 16-bit float");
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int HS, int NKV) {
  const Dims d = dims(B, T, NH, HS, NKV);
  TROUPE_CHECK(out && lse && qkv, "null tensor");
  forward<F32>(out, lse, qkv, d);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int B, int T, int NH, int HS, Out mode, int NKV) {
  const Dims d = dims(B, T, NH, HS, NKV);
  TROUPE_CHECK(dqkv && dout && qkv && out && lse, "null tensor");
  backward<F32>(dqkv, dout, qkv, out, lse, d, mode);
}

void attention_forward_h(DType dt, uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int NH,
                         int HS, int NKV) {
  check_half(dt);
  const Dims d = dims(B, T, NH, HS, NKV);
  TROUPE_CHECK(out && lse && qkv, "null tensor");
  if (dt == DType::bf16)
    forward<BF16>(out, lse, qkv, d);
  else
    forward<F16>(out, lse, qkv, d);
}

void attention_backward_h(DType dt, float* dqkv, const float* dout, const uint16_t* qkv, const uint16_t* out,
                          const float* lse, int B, int T, int NH, int HS, Out mode, int NKV) {
  check_half(dt);
  const Dims d = dims(B, T, NH, HS, NKV);
  TROUPE_CHECK(dqkv && dout && qkv && out && lse, "null tensor");
  if (dt == DType::bf16)
    backward<BF16>(dqkv, dout, qkv, out, lse, d, mode);
  else
    backward<F16>(dqkv, dout, qkv, out, lse, d, mode);
}

}  // namespace troupe::kernels::cuda
