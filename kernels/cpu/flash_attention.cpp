// Fused causal attention (flash-attention style): softmax(q k^T / sqrt(HS) + causal mask) v
// per head without ever storing the (T,T) score matrix. Grouped-query as in attention.cpp:
// query head h reads key/value head h / (NH/NKV).
//
// Forward, per (b, h), per block of kQ query rows [r0, r1):
//   m = -inf, l = 0, acc(kQ,HS) = 0
//   for key blocks [c0, c1) of kK keys, c0 < r1 (causal: later keys are never seen):
//     S = q[r0:r1] k[c0:c1]^T * scale              (kQ, kK): the only score buffer
//     per row t: m' = max(m, max of S over keys <= t);  P = e^(S - m') (0 past t)
//                acc = acc e^(m - m') + P v[c0:c1];    l = l e^(m - m') + sum P
//   out = acc / l;  lse = m + log l                    (lse: the one statistic kept)
//
// Backward, per (b, h): D(t) = dout(t) . out(t) for every row; then per block of kK keys:
//   for the rows that see them — the block's own in kQ-row steps (a prefix of the keys each),
//   then the later ones in kR-row strips (all of the keys) — in order:
//     P  = e^(q k^T * scale - lse)     recomputed, 0 past the diagonal
//     dV += P^T dout;  dP = dout v^T;  dS = P (dP - D) * scale
//     dq += dS k       (each query block's first key block writes it in Out::overwrite)
//     dK += dS^T q
//   dk, dv (+)= dK, dV (the first query head of a key/value head's group writes them)
// Every sum runs in a fixed order over fixed blocks: the same shapes give the same bits.
//
// The block products go through gemm() / gemm_half(): the backend measured fastest on
// their shapes (gemm_dispatch.hpp). In 16 bits (attention_forward_h / backward_h) q, k, v
// and the output are 16-bit; scores, statistics and accumulators are f32; P, dS and dout
// are rounded to 16 bits right before the products that read them, as torch's and
// flash-attention's bf16 kernels do. Where the only 16-bit GEMM for the dtype is convert
// (fp16 without AVX512-FP16 or AMX-FP16), q|k|v are widened to f32 once per call and the
// products run in f32 on the same (exact) values, the roundings of P, dS and dout kept.
//
// Memory: the block buffers (kQ x kK floats each) and, in the backward, D and the 16-bit
// dout of one head (T floats, T x HS halves): O(T HS), never O(T^2).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/gemm_dispatch.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::kernels::cpu {

namespace {

constexpr int kQ = 64;   // query rows per block
constexpr int kK = 256;  // keys per block: a multiple of kQ (the backward starts at row c0)
constexpr int kR = 256;  // backward: rows per strip below a key block's diagonal
static_assert(kK % kQ == 0, "key blocks start on a query block");
static_assert(kR >= kQ, "a strip holds a diagonal block's rows");

// Per-thread block buffers, grown on demand and kept.
struct Scratch {
  std::vector<float> s, p2, acc, m, l, dk, dv, d, row, r1, r2, dout_r, wide_qkv, wide_out;
  std::vector<uint16_t> h1, h2, dout_h;
  template <class T>
  static T* at_least(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
  // The buffer an operand of element type E is rounded into.
  std::vector<float>& operand_buf(int i, float*) { return i == 1 ? r1 : i == 2 ? r2 : dout_r; }
  std::vector<uint16_t>& operand_buf(int i, uint16_t*) { return i == 1 ? h1 : i == 2 ? h2 : dout_h; }
};

// dst(n) = src(n) rounded to dt (bf16 / f16) and widened back: the values a 16-bit operand
// holds, in f32 storage.
void round_through(DType dt, float* dst, const float* src, size_t n) {
  uint16_t chunk[1024];
  for (size_t i = 0; i < n; i += 1024) {
    const size_t m = std::min<size_t>(1024, n - i);
    to_half(dt, chunk, src + i, m);
    from_half(dt, dst + i, chunk, m);
  }
}

// The products on f32 or 16-bit operands (E = float or uint16_t). Outputs are f32.
template <class E>
struct Products;

// f32 operands. With round = bf16 / f16 the operands made from f32 results (P, dS, dout)
// are first rounded to that dtype, so that 16-bit attention on widened q|k|v (the
// attention_*_h of a dtype with no native 16-bit GEMM here) computes what the 16-bit
// products would, up to summation order.
template <>
struct Products<float> {
  DType round = DType::f32;
  // C(M,N) (+)= op(A) op(B), beta 0 or 1.
  void operator()(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                  float beta, float* C, int ldc) const {
    gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  }
  // The operand form of n f32 values: themselves, or rounded into buf.
  const float* operand(const float* src, size_t n, std::vector<float>& buf) const {
    if (round == DType::f32) return src;
    float* r = Scratch::at_least(buf, n);
    round_through(round, r, src, n);
    return r;
  }
  bool rounds() const { return round != DType::f32; }
};

template <>
struct Products<uint16_t> {
  DType dt;
  void operator()(bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
                  int ldb, float beta, float* C, int ldc) const {
    gemm_half(dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
  }
  const uint16_t* operand(const float* src, size_t n, std::vector<uint16_t>& buf) const {
    uint16_t* h = Scratch::at_least(buf, n);
    to_half(dt, h, src, n);
    return h;
  }
  bool rounds() const { return true; }
};

// x(n) as f32: itself, or widened into buf.
const float* widened(const Products<float>&, const float* x, size_t, std::vector<float>&) { return x; }
const float* widened(const Products<uint16_t>& p, const uint16_t* x, size_t n, std::vector<float>& buf) {
  float* f = Scratch::at_least(buf, n);
  from_half(p.dt, f, x, n);
  return f;
}

// One query row's online-softmax step over n scores s (already scaled; keys past the row
// are not among them) and `w` columns of the block: updates m and l, writes P into s
// (zeros from n to w), and returns the factor the row's accumulator is multiplied by.
TROUPE_VEC_CLONES float online_row(float* __restrict__ s, int n, int w, float& m, float& l) {
  if (n <= 0) {
    for (int j = 0; j < w; ++j) s[j] = 0.0f;
    return 1.0f;
  }
  const float mx = std::max(m, detail::lane_max(s, size_t(n)));
  for (int j = 0; j < n; ++j) s[j] = detail::exp_approx(s[j] - mx);
  for (int j = n; j < w; ++j) s[j] = 0.0f;
  const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.0f : detail::exp_approx(m - mx);
  l = l * alpha + detail::lane_sum(s, size_t(n));
  m = mx;
  return alpha;
}

TROUPE_VEC_CLONES void scale_row(float* __restrict__ x, int n, float f) {
  for (int j = 0; j < n; ++j) x[j] *= f;
}

// P(t, j) = e^(s * scale - lse(t)) for the n keys the row sees, 0 for the rest of w.
TROUPE_VEC_CLONES void probabilities_row(float* __restrict__ s, int n, int w, float scale, float lse) {
  for (int j = 0; j < n; ++j) s[j] = detail::exp_approx(s[j] * scale - lse);
  for (int j = (n > 0 ? n : 0); j < w; ++j) s[j] = 0.0f;
}

// dS = P (dP - D) * scale, in place in dp.
TROUPE_VEC_CLONES void dscores_row(float* __restrict__ dp, const float* __restrict__ p, int w, float D,
                                   float scale) {
  for (int j = 0; j < w; ++j) dp[j] = p[j] * (dp[j] - D) * scale;
}

struct Shape {
  int B, T, NH, HS, NKV, C, CKV, ld, group;
  float scale;
  Shape(int B_, int T_, int NH_, int HS_, int NKV_) : B(B_), T(T_), NH(NH_), HS(HS_) {
    NKV = attention_kv_heads(B, T, NH, HS, NKV_);
    C = NH * HS;
    CKV = NKV * HS;
    ld = C + 2 * CKV;
    group = NH / NKV;
    scale = 1.0f / std::sqrt(float(HS));
  }
};

// out (row stride C) is E: f32, or 16-bit rounded from the f32 result.
template <class E>
void forward(const Products<E>& prod, const Shape& sh, E* out, float* lse, const E* qkv) {
  thread_local Scratch sc;
  const int T = sh.T, HS = sh.HS, ld = sh.ld;
  float* s = Scratch::at_least(sc.s, size_t(kQ) * kK);
  float* acc = Scratch::at_least(sc.acc, size_t(kQ) * HS);
  float* m = Scratch::at_least(sc.m, kQ);
  float* l = Scratch::at_least(sc.l, kQ);
  for (int b = 0; b < sh.B; ++b)
    for (int h = 0; h < sh.NH; ++h) {
      const E* q = qkv + size_t(b) * T * ld + size_t(h) * HS;                    // (T,HS), stride ld
      const E* k = qkv + size_t(b) * T * ld + sh.C + size_t(h / sh.group) * HS;  // (T,HS), stride ld
      const E* v = k + sh.CKV;
      E* o = out + size_t(b) * T * sh.C + size_t(h) * HS;  // (T,HS), stride C
      float* lrow = lse + (size_t(b) * sh.NH + h) * T;     // (T)
      for (int r0 = 0; r0 < T; r0 += kQ) {
        const int r1 = std::min(r0 + kQ, T), nr = r1 - r0;
        for (int i = 0; i < nr; ++i) {
          m[i] = -std::numeric_limits<float>::infinity();
          l[i] = 0.0f;
        }
        for (int c0 = 0; c0 < r1; c0 += kK) {
          const int nc = std::min(c0 + kK, r1) - c0;
          prod(false, true, nr, nc, HS, q + size_t(r0) * ld, ld, k + size_t(c0) * ld, ld, 0.0f, s, nc);
          for (int i = 0; i < nr; ++i) {
            float* row = s + size_t(i) * nc;
            const int n = std::min(nc, r0 + i + 1 - c0);  // keys c0 .. t
            scale_row(row, std::max(n, 0), sh.scale);
            const float alpha = online_row(row, n, nc, m[i], l[i]);
            if (c0 > 0) scale_row(acc + size_t(i) * HS, HS, alpha);
          }
          const E* p = prod.operand(s, size_t(nr) * nc, sc.operand_buf(1, (E*)nullptr));
          prod(false, false, nr, HS, nc, p, nc, v + size_t(c0) * ld, ld, c0 == 0 ? 0.0f : 1.0f, acc, HS);
        }
        for (int i = 0; i < nr; ++i) {
          scale_row(acc + size_t(i) * HS, HS, 1.0f / l[i]);
          lrow[r0 + i] = m[i] + std::log(l[i]);
        }
        for (int i = 0; i < nr; ++i) {
          const float* a = acc + size_t(i) * HS;
          E* dst = o + size_t(r0 + i) * sh.C;
          if constexpr (std::is_same_v<E, float>)
            std::copy(a, a + HS, dst);
          else
            to_half(prod.dt, dst, a, size_t(HS));
        }
      }
    }
}

template <class E>
void backward(const Products<E>& prod, const Shape& sh, float* dqkv, const float* dout, const E* qkv,
              const E* out, const float* lse, Out mode) {
  thread_local Scratch sc;
  const int T = sh.T, HS = sh.HS, ld = sh.ld, C = sh.C;
  float* p = Scratch::at_least(sc.s, size_t(kR) * kK);
  float* dp = Scratch::at_least(sc.p2, size_t(kR) * kK);
  float* dk = Scratch::at_least(sc.dk, size_t(kK) * HS);
  float* dv = Scratch::at_least(sc.dv, size_t(kK) * HS);
  float* D = Scratch::at_least(sc.d, size_t(T));
  const float beta_q = mode == Out::overwrite ? 0.0f : 1.0f;
  for (int b = 0; b < sh.B; ++b)
    for (int h = 0; h < sh.NH; ++h) {
      const size_t head = size_t(b) * T * ld + size_t(h) * HS;
      const size_t kvh = size_t(b) * T * ld + C + size_t(h / sh.group) * HS;
      const E* q = qkv + head;  // (T,HS), stride ld; k, v and the gradients likewise
      const E* k = qkv + kvh;
      const E* v = k + sh.CKV;
      float* dq = dqkv + head;
      float* dkg = dqkv + kvh;
      float* dvg = dkg + sh.CKV;
      const float* g = dout + size_t(b) * T * C + size_t(h) * HS;  // (T,HS), stride C
      const E* o = out + size_t(b) * T * C + size_t(h) * HS;       // (T,HS), stride C
      const float* lrow = lse + (size_t(b) * sh.NH + h) * T;
      const float beta_kv = h % sh.group == 0 ? beta_q : 1.0f;
      // D(t) = dout(t) . out(t); dout in the operand form (16-bit: rounded once per head).
      for (int t = 0; t < T; ++t)
        D[t] = detail::lane_dot(g + size_t(t) * C, widened(prod, o + size_t(t) * C, size_t(HS), sc.row),
                                size_t(HS));
      const E* go = nullptr;
      int ldg = C;
      if constexpr (std::is_same_v<E, float>) go = g;
      if (prod.rounds()) {  // dout rounded once per head, compact (T,HS)
        E* gh = Scratch::at_least(sc.operand_buf(3, (E*)nullptr), size_t(T) * HS);
        for (int t = 0; t < T; ++t)
          std::copy_n(prod.operand(g + size_t(t) * C, size_t(HS), sc.operand_buf(1, (E*)nullptr)), HS,
                      gh + size_t(t) * HS);
        go = gh;
        ldg = HS;
      }
      for (int c0 = 0; c0 < T; c0 += kK) {
        const int c1 = std::min(c0 + kK, T);
        // dK, dV of the block: the query blocks below see a growing prefix of its keys.
        std::fill(dk, dk + size_t(c1 - c0) * HS, 0.0f);
        std::fill(dv, dv + size_t(c1 - c0) * HS, 0.0f);
        // Rows [r0, r0 + nr) against keys [c0, c0 + nc); `diagonal`: some of them see only a
        // prefix of the keys (the rest of their row of P is 0).
        auto rows = [&](int r0, int nr, int nc, bool diagonal) {
          prod(false, true, nr, nc, HS, q + size_t(r0) * ld, ld, k + size_t(c0) * ld, ld, 0.0f, p, nc);
          for (int i = 0; i < nr; ++i)
            probabilities_row(p + size_t(i) * nc, diagonal ? std::min(nc, r0 + i + 1 - c0) : nc, nc, sh.scale,
                              lrow[r0 + i]);
          const E* ph = prod.operand(p, size_t(nr) * nc, sc.operand_buf(1, (E*)nullptr));
          // dV(nc,HS) += P^T dout;  dP(nr,nc) = dout v^T
          prod(true, false, nc, HS, nr, ph, nc, go + size_t(r0) * ldg, ldg, 1.0f, dv, HS);
          prod(false, true, nr, nc, HS, go + size_t(r0) * ldg, ldg, v + size_t(c0) * ld, ld, 0.0f, dp, nc);
          for (int i = 0; i < nr; ++i)
            dscores_row(dp + size_t(i) * nc, p + size_t(i) * nc, nc, D[r0 + i], sh.scale);
          const E* dsh = prod.operand(dp, size_t(nr) * nc, sc.operand_buf(2, (E*)nullptr));
          // dq(nr,HS) (+)= dS k: a row's first key block (c0 = 0) writes it in Out::overwrite;
          // dK(nc,HS) += dS^T q
          prod(false, false, nr, HS, nc, dsh, nc, k + size_t(c0) * ld, ld, c0 == 0 ? beta_q : 1.0f,
               dq + size_t(r0) * ld, ld);
          prod(true, false, nc, HS, nr, dsh, nc, q + size_t(r0) * ld, ld, 1.0f, dk, HS);
        };
        // The block's own rows in kQ-row steps (each sees a prefix of the keys), then every later
        // row, which sees them all, in kR-row strips: long products, no masked work.
        for (int r0 = c0; r0 < c1; r0 += kQ)
          rows(r0, std::min(r0 + kQ, c1) - r0, std::min(r0 + kQ, c1) - c0, true);
        for (int r0 = c1; r0 < T; r0 += kR) rows(r0, std::min(kR, T - r0), c1 - c0, false);
        const int w = c1 - c0;
        for (int j = 0; j < w; ++j) {
          float* dkr = dkg + size_t(c0 + j) * ld;
          float* dvr = dvg + size_t(c0 + j) * ld;
          const float* sk = dk + size_t(j) * HS;
          const float* sv = dv + size_t(j) * HS;
          if (beta_kv == 0.0f) {
            std::copy(sk, sk + HS, dkr);
            std::copy(sv, sv + HS, dvr);
          } else {
            for (int c = 0; c < HS; ++c) {
              dkr[c] += sk[c];
              dvr[c] += sv[c];
            }
          }
        }
      }
    }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int HS, int NKV) {
  const Shape sh(B, T, NH, HS, NKV);
  TROUPE_CHECK(out && lse && qkv, "null tensor");
  forward(Products<float>{}, sh, out, lse, qkv);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int B, int T, int NH, int HS, Out mode, int NKV) {
  const Shape sh(B, T, NH, HS, NKV);
  TROUPE_CHECK(dqkv && dout && qkv && out && lse, "null tensor");
  backward(Products<float>{}, sh, dqkv, dout, qkv, out, lse, mode);
}

namespace {

// Whether 16-bit attention in dt runs its products on 16-bit operands (a native 16-bit GEMM is
// the fastest for the block shape here), or on q|k|v widened to f32 once per call (when the
// only 16-bit backend is convert, which would widen every block again).
bool native_half(DType dt, int T, int HS) {
  const int b = gemm_dispatch(dt, false, true, std::min(kQ, T), std::min(kK, T), HS);
  return static_cast<HalfGemmBackend>(b) != HalfGemmBackend::convert;
}

float* widen_all(DType dt, std::vector<float>& buf, const uint16_t* x, size_t n) {
  float* f = Scratch::at_least(buf, n);
  from_half(dt, f, x, n);
  return f;
}

}  // namespace

void attention_forward_h(DType dt, uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int NH,
                         int HS, int NKV) {
  const Shape sh(B, T, NH, HS, NKV);
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16, "attention_forward_h: dtype ", dtype_name(dt));
  TROUPE_CHECK(out && lse && qkv, "null tensor");
  if (native_half(dt, T, HS)) return forward(Products<uint16_t>{dt}, sh, out, lse, qkv);
  thread_local Scratch wide;
  const size_t n_qkv = size_t(B) * T * sh.ld, n_out = size_t(B) * T * sh.C;
  const float* q32 = widen_all(dt, wide.wide_qkv, qkv, n_qkv);
  float* o32 = Scratch::at_least(wide.wide_out, n_out);
  forward(Products<float>{dt}, sh, o32, lse, q32);
  to_half(dt, out, o32, n_out);
}

void attention_backward_h(DType dt, float* dqkv, const float* dout, const uint16_t* qkv, const uint16_t* out,
                          const float* lse, int B, int T, int NH, int HS, Out mode, int NKV) {
  const Shape sh(B, T, NH, HS, NKV);
  TROUPE_CHECK(dt == DType::bf16 || dt == DType::f16, "attention_backward_h: dtype ", dtype_name(dt));
  TROUPE_CHECK(dqkv && dout && qkv && out && lse, "null tensor");
  if (native_half(dt, T, HS)) return backward(Products<uint16_t>{dt}, sh, dqkv, dout, qkv, out, lse, mode);
  thread_local Scratch wide;
  const float* q32 = widen_all(dt, wide.wide_qkv, qkv, size_t(B) * T * sh.ld);
  const float* o32 = widen_all(dt, wide.wide_out, out, size_t(B) * T * sh.C);
  backward(Products<float>{dt}, sh, dqkv, dout, q32, o32, lse, mode);
}

}  // namespace troupe::kernels::cpu
