// Token + position embedding. Positions start at 0 for every sequence of the batch.
#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"

namespace troupe::kernels::cpu {

namespace {

void check_tokens(const int32_t* tokens, size_t n, int V) {
  for (size_t i = 0; i < n; ++i)
    TROUPE_CHECK(tokens[i] >= 0 && tokens[i] < V, "token ", tokens[i], " at ", i, " outside [0,", V, ")");
}

void copy_add(float* __restrict__ out, const float* __restrict__ a, const float* __restrict__ b, int C) {
  for (int c = 0; c < C; ++c) out[c] = a[c] + b[c];
}

void copy(float* __restrict__ out, const float* __restrict__ a, int C) {
  for (int c = 0; c < C; ++c) out[c] = a[c];
}

void accumulate(float* __restrict__ y, const float* __restrict__ x, int C) {
  for (int c = 0; c < C; ++c) y[c] += x[c];
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C, int V) {
  TROUPE_CHECK(B > 0 && T > 0 && C > 0 && V > 0, "B=", B, " T=", T, " C=", C, " V=", V);
  TROUPE_CHECK(out && tokens && wte, "null tensor");
  check_tokens(tokens, size_t(B) * T, V);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t bt = size_t(b) * T + t;
      float* o = out + bt * C;                        // (C)
      const float* e = wte + size_t(tokens[bt]) * C;  // (C)
      if (wpe)
        copy_add(o, e, wpe + size_t(t) * C, C);
      else
        copy(o, e, C);
    }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C, int V) {
  TROUPE_CHECK(B > 0 && T > 0 && C > 0 && V > 0, "B=", B, " T=", T, " C=", C, " V=", V);
  TROUPE_CHECK(dwte && dout && tokens, "null tensor");
  check_tokens(tokens, size_t(B) * T, V);
  // A fixed (b,t) order: repeated tokens sum in the same order every time.
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t bt = size_t(b) * T + t;
      const float* g = dout + bt * C;  // (C)
      accumulate(dwte + size_t(tokens[bt]) * C, g, C);
      if (dwpe) accumulate(dwpe + size_t(t) * C, g, C);
    }
}

}  // namespace troupe::kernels::cpu
