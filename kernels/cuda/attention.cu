// Causal (grouped-query) attention: the score and value products as cuBLAS strided-batched
// GEMMs over the heads of a batch row, and a causal softmax kernel (one block per query row).
// For a batch row b and a position j inside the query groups, the heads h = kv * group + j
// (kv in [0, NKV)) lie group*HS floats apart in qkv and their key/value heads HS apart: one
// batched call each. The full (T,T) square is multiplied (the CPU twin skips most of the
// upper triangle); the softmax zeroes it. A fused flash-style kernel is the next step.
#include <cmath>

#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/kernels.cuh"

namespace troupe::kernels::cuda {

namespace {

using detail::kThreads;
using detail::stream;

// rows of (T): row r's query position is r % T; entries past it become 0.
__global__ void k_causal_softmax(float* att, int T) {
  __shared__ float shared[kThreads];
  const size_t r = blockIdx.x;
  const int n = int(r % T) + 1;
  float* row = att + r * T;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < n; s += blockDim.x) mx = fmaxf(mx, row[s]);
  mx = detail::block_reduce(mx, shared, detail::Max{});
  float sum = 0.0f;
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const float e = expf(row[s] - mx);
    row[s] = e;
    sum += e;
  }
  const float inv = 1.0f / detail::block_reduce(sum, shared, detail::Sum{});
  for (int s = threadIdx.x; s < T; s += blockDim.x) row[s] = s < n ? row[s] * inv : 0.0f;
}

// d = dL/datt becomes scale * dL/dscores = scale * p * (d - <p, d>), zero past the query.
__global__ void k_causal_softmax_backward(float* d, const float* att, int T, float scale) {
  __shared__ float shared[kThreads];
  const size_t r = blockIdx.x;
  const int n = int(r % T) + 1;
  float* dr = d + r * T;
  const float* p = att + r * T;
  float pd = 0.0f;
  for (int s = threadIdx.x; s < n; s += blockDim.x) pd += p[s] * dr[s];
  pd = detail::block_reduce(pd, shared, detail::Sum{});
  for (int s = threadIdx.x; s < T; s += blockDim.x) dr[s] = s < n ? scale * p[s] * (dr[s] - pd) : 0.0f;
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS, int NKV) {
  NKV = cpu::attention_kv_heads(B, T, NH, HS, NKV);
  TROUPE_CHECK(out && att && qkv, "null tensor");
  const int C = NH * HS, CKV = NKV * HS, ld = C + 2 * CKV, group = NH / NKV;
  const float scale = 1.0f / std::sqrt(float(HS));
  const long long TT = (long long)T * T;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < group; ++j) {
      const float* q = qkv + size_t(b) * T * ld + size_t(j) * HS;  // head j of group 0
      const float* k = qkv + size_t(b) * T * ld + C;
      float* a = att + (size_t(b) * NH + j) * TT;
      // a(T,T) = scale * q k^T for each kv
      detail::gemm_batched(false, true, T, T, HS, scale, q, ld, (long long)group * HS, k, ld, HS, 0.0f, a, T,
                           group * TT, NKV);
    }
  k_causal_softmax<<<unsigned(size_t(B) * NH * T), kThreads, 0, stream()>>>(att, T);
  TROUPE_CUDA_LAUNCHED();
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < group; ++j) {
      const float* v = qkv + size_t(b) * T * ld + C + CKV;
      const float* a = att + (size_t(b) * NH + j) * TT;
      float* o = out + size_t(b) * T * C + size_t(j) * HS;
      // o(T,HS) = a v
      detail::gemm_batched(false, false, T, HS, T, 1.0f, a, T, group * TT, v, ld, HS, 0.0f, o, C,
                           (long long)group * HS, NKV);
    }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                        int B, int T, int NH, int HS, Out mode, int NKV) {
  NKV = cpu::attention_kv_heads(B, T, NH, HS, NKV);
  TROUPE_CHECK(dqkv && scratch && dout && qkv && att, "null tensor");
  TROUPE_CHECK(scratch != att, "scratch must not alias att");
  const int C = NH * HS, CKV = NKV * HS, ld = C + 2 * CKV, group = NH / NKV;
  const float scale = 1.0f / std::sqrt(float(HS));
  const long long TT = (long long)T * T;
  const long long sq = (long long)group * HS;  // between the query heads of one call
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < group; ++j) {
      const float* g = dout + size_t(b) * T * C + size_t(j) * HS;
      const float* v = qkv + size_t(b) * T * ld + C + CKV;
      float* d = scratch + (size_t(b) * NH + j) * TT;
      // d(T,T) = dL/da = g v^T
      detail::gemm_batched(false, true, T, T, HS, 1.0f, g, C, sq, v, ld, HS, 0.0f, d, T, group * TT, NKV);
    }
  k_causal_softmax_backward<<<unsigned(size_t(B) * NH * T), kThreads, 0, stream()>>>(scratch, att, T, scale);
  TROUPE_CUDA_LAUNCHED();
  const float beta_q = mode == Out::overwrite ? 0.0f : 1.0f;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < group; ++j) {
      // dk and dv take a product from every query head of their group: the first overwrites
      // in Out::overwrite, the rest add, in the order of j.
      const float beta = j == 0 ? beta_q : 1.0f;
      const size_t row0 = size_t(b) * T * ld;
      const float* q = qkv + row0 + size_t(j) * HS;
      const float* k = qkv + row0 + C;
      float* dq = dqkv + row0 + size_t(j) * HS;
      float* dk = dqkv + row0 + C;
      float* dv = dk + CKV;
      const float* a = att + (size_t(b) * NH + j) * TT;
      const float* d = scratch + (size_t(b) * NH + j) * TT;
      const float* g = dout + size_t(b) * T * C + size_t(j) * HS;
      // dv(T,HS) (+)= a^T g
      detail::gemm_batched(true, false, T, HS, T, 1.0f, a, T, group * TT, g, C, sq, beta, dv, ld, HS, NKV);
      // dk(T,HS) (+)= d^T q
      detail::gemm_batched(true, false, T, HS, T, 1.0f, d, T, group * TT, q, ld, sq, beta, dk, ld, HS, NKV);
      // dq(T,HS) (+)= d k
      detail::gemm_batched(false, false, T, HS, T, 1.0f, d, T, group * TT, k, ld, HS, beta_q, dq, ld, sq,
                           NKV);
    }
}

}  // namespace troupe::kernels::cuda
