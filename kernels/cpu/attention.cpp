// The materialized causal attention (the tests' reference for the fused kernels of
// flash_attention.cpp): softmax(q k^T / sqrt(HS) + causal mask) v per head, the (T,T)
// probabilities stored.
// Grouped-query attention (NKV < NH key/value heads): query head h reads key/value head
// h / (NH/NKV); NKV = NH is GPT's multi-head attention.
//
// Every product goes through gemm() on strided views of qkv (row stride 3*C), one head at a
// time. Only the lower triangle of the (T,T) score matrix matters, so queries are taken in
// blocks of kBlock rows and each block multiplies against the keys up to its own last row:
// for T = 1024 that is ~53% of the full square's work. The block size is fixed, so the
// summation order (hence every bit of the result) does not depend on anything but the shapes.
#include <cmath>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::kernels::cpu {

namespace {

constexpr int kBlock = 64;

// row(T): scores of one query in [0,n), n = t+1; becomes probabilities, zero beyond n.
TROUPE_VEC_CLONES void softmax_row(float* __restrict__ row, int n, int T) {
  const float mx = detail::lane_max(row, n);  // stable: the largest exponent is e^0
  for (int s = 0; s < n; ++s) row[s] = detail::exp_approx(row[s] - mx);
  const float inv = 1.0f / detail::lane_sum(row, n);
  for (int s = 0; s < n; ++s) row[s] *= inv;
  for (int s = n; s < T; ++s) row[s] = 0.0f;
}

// d(T): dL/datt for one query, becomes scale * dL/dscores (softmax Jacobian), zero beyond n.
TROUPE_VEC_CLONES void softmax_row_backward(float* __restrict__ d, const float* __restrict__ p, int n, int T,
                                            float scale) {
  const float pd = detail::lane_dot(p, d, n);
  for (int s = 0; s < n; ++s) d[s] = scale * p[s] * (d[s] - pd);
  for (int s = n; s < T; ++s) d[s] = 0.0f;
}

}  // namespace

int attention_kv_heads(int B, int T, int NH, int HS, int NKV) {
  if (NKV == 0) NKV = NH;
  TROUPE_CHECK(B > 0 && T > 0 && NH > 0 && HS > 0 && NKV > 0 && NH % NKV == 0, "B=", B, " T=", T, " NH=", NH,
               " NKV=", NKV, " HS=", HS);
  return NKV;
}

void attention_materialized_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS,
                                    int NKV) {
  NKV = attention_kv_heads(B, T, NH, HS, NKV);
  TROUPE_CHECK(out && att && qkv, "null tensor");
  const int C = NH * HS, CKV = NKV * HS, ld = C + 2 * CKV, group = NH / NKV;
  const float scale = 1.0f / std::sqrt(float(HS));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + size_t(b) * T * ld + size_t(h) * HS;              // (T,HS), row stride ld
      const float* k = qkv + size_t(b) * T * ld + C + size_t(h / group) * HS;  // (T,HS), row stride ld
      const float* v = k + CKV;                                                // (T,HS), row stride ld
      float* a = att + (size_t(b) * NH + h) * T * T;                           // (T,T)
      float* o = out + size_t(b) * T * C + size_t(h) * HS;                     // (T,HS), row stride C
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        const int r1 = r0 + kBlock < T ? r0 + kBlock : T;
        // a[r0:r1, 0:r1] = scale * q[r0:r1] k[0:r1]^T
        gemm(false, true, r1 - r0, r1, HS, scale, q + size_t(r0) * ld, ld, k, ld, 0.0f, a + size_t(r0) * T,
             T);
      }
      for (int t = 0; t < T; ++t) softmax_row(a + size_t(t) * T, t + 1, T);
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        const int r1 = r0 + kBlock < T ? r0 + kBlock : T;
        // o[r0:r1] = a[r0:r1, 0:r1] v[0:r1]; columns past r1 are masked zeros
        gemm(false, false, r1 - r0, HS, r1, 1.0f, a + size_t(r0) * T, T, v, ld, 0.0f, o + size_t(r0) * C, C);
      }
    }
}

void attention_materialized_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                     const float* att, int B, int T, int NH, int HS, Out mode, int NKV) {
  NKV = attention_kv_heads(B, T, NH, HS, NKV);
  TROUPE_CHECK(dqkv && scratch && dout && qkv && att, "null tensor");
  TROUPE_CHECK(scratch != att, "scratch must not alias att");
  const int C = NH * HS, CKV = NKV * HS, ld = C + 2 * CKV, group = NH / NKV;
  const float scale = 1.0f / std::sqrt(float(HS));
  // Each block of rows of dq is written by exactly one product below; those of dk and dv
  // by one per query head of their group, the first of which overwrites in Out::overwrite.
  const float beta_q = mode == Out::overwrite ? 0.0f : 1.0f;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const float beta = h % group == 0 ? beta_q : 1.0f;
      const size_t head = size_t(b) * T * ld + size_t(h) * HS;
      const size_t kv = size_t(b) * T * ld + C + size_t(h / group) * HS;
      const float* q = qkv + head;  // (T,HS), row stride ld; k, v and the gradients likewise
      const float* k = qkv + kv;
      const float* v = k + CKV;
      float* dq = dqkv + head;
      float* dk = dqkv + kv;
      float* dv = dk + CKV;
      const float* a = att + (size_t(b) * NH + h) * T * T;         // (T,T)
      float* d = scratch + (size_t(b) * NH + h) * T * T;           // (T,T)
      const float* g = dout + size_t(b) * T * C + size_t(h) * HS;  // (T,HS), row stride C
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        const int r1 = r0 + kBlock < T ? r0 + kBlock : T;
        // d[r0:r1, 0:r1] = dL/da = g[r0:r1] v[0:r1]^T
        gemm(false, true, r1 - r0, r1, HS, 1.0f, g + size_t(r0) * C, C, v, ld, 0.0f, d + size_t(r0) * T, T);
      }
      for (int t = 0; t < T; ++t) softmax_row_backward(d + size_t(t) * T, a + size_t(t) * T, t + 1, T, scale);
      for (int c0 = 0; c0 < T; c0 += kBlock) {
        const int c1 = c0 + kBlock < T ? c0 + kBlock : T;
        // Key s only meets queries t >= s: dv[c0:c1] += a[c0:T, c0:c1]^T g[c0:T]
        gemm(true, false, c1 - c0, HS, T - c0, 1.0f, a + size_t(c0) * T + c0, T, g + size_t(c0) * C, C, beta,
             dv + size_t(c0) * ld, ld);
        // dk[c0:c1] += d[c0:T, c0:c1]^T q[c0:T]
        gemm(true, false, c1 - c0, HS, T - c0, 1.0f, d + size_t(c0) * T + c0, T, q + size_t(c0) * ld, ld,
             beta, dk + size_t(c0) * ld, ld);
      }
      for (int r0 = 0; r0 < T; r0 += kBlock) {
        const int r1 = r0 + kBlock < T ? r0 + kBlock : T;
        // dq[r0:r1] += d[r0:r1, 0:r1] k[0:r1]
        gemm(false, false, r1 - r0, HS, r1, 1.0f, d + size_t(r0) * T, T, k, ld, beta_q, dq + size_t(r0) * ld,
             ld);
      }
    }
}

}  // namespace troupe::kernels::cpu
