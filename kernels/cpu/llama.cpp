// The layers a Llama-family block adds to GPT's: RMSNorm, rotary position embeddings,
// SwiGLU, and the vocabulary-parallel embedding and cross-entropy (a shard holds the
// rows [v0, v0 + Vl) of the vocabulary). Contracts in kernels/cpu/kernels.hpp.
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::kernels::cpu {

namespace {

TROUPE_VEC_CLONES float sum_sq(const float* __restrict__ x, int C) {
  return detail::lane_dot(x, x, size_t(C));
}

TROUPE_VEC_CLONES void scale_mul(float* __restrict__ y, const float* __restrict__ x,
                                 const float* __restrict__ w, float r, int C) {
  for (int c = 0; c < C; ++c) y[c] = x[c] * r * w[c];
}

// dx += r * (w*g) - x * r^3 * mean(w*g*x); dw += g * x * r.
TROUPE_VEC_CLONES void rms_row_backward(float* __restrict__ dx, float* __restrict__ dw,
                                        const float* __restrict__ g, const float* __restrict__ x,
                                        const float* __restrict__ w, float r, int C) {
  const float k = detail::lane_dot3(w, g, x, size_t(C)) / float(C) * r * r * r;
  for (int c = 0; c < C; ++c) {
    dx[c] += r * w[c] * g[c] - x[c] * k;
    dw[c] += g[c] * x[c] * r;
  }
}

inline float sigmoid(float x) { return 1.0f / (1.0f + detail::exp_approx(-x)); }

TROUPE_VEC_CLONES void swiglu_row(float* __restrict__ out, const float* __restrict__ g,
                                  const float* __restrict__ u, int F) {
  for (int f = 0; f < F; ++f) out[f] = g[f] * sigmoid(g[f]) * u[f];
}

TROUPE_VEC_CLONES void swiglu_row_backward(float* __restrict__ dg, float* __restrict__ du,
                                           const float* __restrict__ d, const float* __restrict__ g,
                                           const float* __restrict__ u, int F) {
  for (int f = 0; f < F; ++f) {
    const float s = sigmoid(g[f]);
    du[f] = d[f] * g[f] * s;
    dg[f] = d[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
  }
}

TROUPE_VEC_CLONES float sum_exp_row(const float* __restrict__ l, int V, float mx) {
  return detail::lane_sum_exp(l, size_t(V), mx);
}

TROUPE_VEC_CLONES void softmax_row_grad(float* __restrict__ dl, const float* __restrict__ l, int V, float lse,
                                        float dloss) {
  for (int v = 0; v < V; ++v) dl[v] = detail::exp_approx(l[v] - lse) * dloss;
}

// The rotation of position t, channel pair i: cos and sin of t * inv_freq[i], the angle
// formed in f32 as Hugging Face's LlamaRotaryEmbedding forms it.
void rope_table(std::vector<float>& cs, int T, int HS, const float* inv_freq) {
  const int half = HS / 2;
  cs.resize(size_t(T) * half * 2);
  for (int i = 0; i < half; ++i) {
    for (int t = 0; t < T; ++t) {
      const float angle = float(t) * inv_freq[i];
      cs[(size_t(t) * half + i) * 2] = float(std::cos(double(angle)));
      cs[(size_t(t) * half + i) * 2 + 1] = float(std::sin(double(angle)));
    }
  }
}

void rope_apply(float* x, int B, int T, int n_heads, int HS, int ld, const float* inv_freq, float sign) {
  TROUPE_CHECK(B > 0 && T > 0 && n_heads > 0 && HS > 0 && HS % 2 == 0 && ld >= n_heads * HS, "rope: B=", B,
               " T=", T, " heads=", n_heads, " HS=", HS, " ld=", ld);
  TROUPE_CHECK(x != nullptr && inv_freq != nullptr, "null tensor");
  thread_local std::vector<float> cs;
  rope_table(cs, T, HS, inv_freq);
  const int half = HS / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* r = cs.data() + size_t(t) * half * 2;
      float* row = x + (size_t(b) * T + t) * ld;
      for (int h = 0; h < n_heads; ++h) {
        float* p = row + size_t(h) * HS;
        for (int i = 0; i < half; ++i) {
          const float c = r[2 * i], s = sign * r[2 * i + 1];
          const float a = p[i], e = p[i + half];
          p[i] = a * c - e * s;
          p[i + half] = e * c + a * s;
        }
      }
    }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
  TROUPE_CHECK(N > 0 && C > 0 && eps > 0.0f, "rmsnorm: N=", N, " C=", C, " eps=", eps);
  TROUPE_CHECK(out && rstd && inp && weight, "null tensor");
  for (int n = 0; n < N; ++n) {
    const float* x = inp + size_t(n) * C;
    const float r = 1.0f / std::sqrt(sum_sq(x, C) / float(C) + eps);
    rstd[n] = r;
    scale_mul(out + size_t(n) * C, x, weight, r, C);
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  TROUPE_CHECK(N > 0 && C > 0, "rmsnorm: N=", N, " C=", C);
  TROUPE_CHECK(dinp && dweight && dout && inp && weight && rstd, "null tensor");
  for (int n = 0; n < N; ++n)
    rms_row_backward(dinp + size_t(n) * C, dweight, dout + size_t(n) * C, inp + size_t(n) * C, weight,
                     rstd[n], C);
}

void rope_forward(float* x, int B, int T, int n_heads, int HS, int ld, const float* inv_freq) {
  rope_apply(x, B, T, n_heads, HS, ld, inv_freq, 1.0f);
}

void rope_backward(float* dx, int B, int T, int n_heads, int HS, int ld, const float* inv_freq) {
  rope_apply(dx, B, T, n_heads, HS, ld, inv_freq, -1.0f);
}

void swiglu_forward(float* out, const float* gu, int N, int F) {
  TROUPE_CHECK(N > 0 && F > 0, "swiglu: N=", N, " F=", F);
  TROUPE_CHECK(out && gu, "null tensor");
  for (int n = 0; n < N; ++n) {
    const float* g = gu + size_t(n) * 2 * F;
    swiglu_row(out + size_t(n) * F, g, g + F, F);
  }
}

void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) {
  TROUPE_CHECK(N > 0 && F > 0, "swiglu: N=", N, " F=", F);
  TROUPE_CHECK(dgu && dout && gu, "null tensor");
  for (int n = 0; n < N; ++n) {
    const float* g = gu + size_t(n) * 2 * F;
    float* dg = dgu + size_t(n) * 2 * F;
    swiglu_row_backward(dg, dg + F, dout + size_t(n) * F, g, g + F, F);
  }
}

void embedding_rows_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int v0,
                            int Vl) {
  TROUPE_CHECK(N > 0 && C > 0 && v0 >= 0 && Vl > 0, "embedding rows: N=", N, " C=", C, " v0=", v0,
               " Vl=", Vl);
  TROUPE_CHECK(out && tokens && wte, "null tensor");
  for (int n = 0; n < N; ++n) {
    float* o = out + size_t(n) * C;
    const int64_t r = int64_t{tokens[n]} - v0;
    if (r >= 0 && r < Vl) {
      const float* w = wte + size_t(r) * C;
      for (int c = 0; c < C; ++c) o[c] = w[c];
    } else {
      for (int c = 0; c < C; ++c) o[c] = 0.0f;
    }
  }
}

void embedding_rows_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int v0,
                             int Vl) {
  TROUPE_CHECK(N > 0 && C > 0 && v0 >= 0 && Vl > 0, "embedding rows: N=", N, " C=", C, " v0=", v0,
               " Vl=", Vl);
  TROUPE_CHECK(dwte && dout && tokens, "null tensor");
  for (int n = 0; n < N; ++n) {
    const int64_t r = int64_t{tokens[n]} - v0;
    if (r < 0 || r >= Vl) continue;
    float* dw = dwte + size_t(r) * C;
    const float* d = dout + size_t(n) * C;
    for (int c = 0; c < C; ++c) dw[c] += d[c];
  }
}

void cross_entropy_stats(float* row_max, float* row_sum_exp, float* target_logit, const float* logits,
                         const int32_t* targets, int N, int Vl, int v0) {
  TROUPE_CHECK(N > 0 && Vl > 0 && v0 >= 0, "cross-entropy stats: N=", N, " Vl=", Vl, " v0=", v0);
  TROUPE_CHECK(row_max && row_sum_exp && target_logit && logits && targets, "null tensor");
  for (int n = 0; n < N; ++n) {
    const float* l = logits + size_t(n) * Vl;
    const float mx = detail::lane_max(l, size_t(Vl));
    row_max[n] = mx;
    row_sum_exp[n] = sum_exp_row(l, Vl, mx);
    const int64_t r = int64_t{targets[n]} - v0;
    target_logit[n] = r >= 0 && r < Vl ? l[r] : 0.0f;
  }
}

void cross_entropy_shard_backward(float* dlogits, const float* logits, const int32_t* targets,
                                  const float* lse, int N, int Vl, int v0, float dloss) {
  TROUPE_CHECK(N > 0 && Vl > 0 && v0 >= 0, "cross-entropy backward: N=", N, " Vl=", Vl, " v0=", v0);
  TROUPE_CHECK(dlogits && logits && targets && lse, "null tensor");
  for (int n = 0; n < N; ++n) {
    float* dl = dlogits + size_t(n) * Vl;
    softmax_row_grad(dl, logits + size_t(n) * Vl, Vl, lse[n], dloss);
    const int64_t r = int64_t{targets[n]} - v0;
    if (r >= 0 && r < Vl) dl[r] -= dloss;
  }
}

}  // namespace troupe::kernels::cpu
