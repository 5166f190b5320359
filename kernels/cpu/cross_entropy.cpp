// Softmax cross-entropy over rows of logits, stable form:
//   loss = log(sum_v e^(l_v - max)) + max - l_target.
#include <cmath>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::kernels::cpu {

namespace {

// sum_v e^(l_v - mx) over l(V), compiled for each vector width.
TROUPE_VEC_CLONES float sum_exp(const float* __restrict__ l, int V, float mx) {
  return detail::lane_sum_exp(l, size_t(V), mx);
}

// dl(V) += softmax(l) * dloss; the one-hot part is subtracted by the caller.
TROUPE_VEC_CLONES void softmax_grad(float* __restrict__ dl, const float* __restrict__ l, int V, float mx,
                                    float inv_sum, float dloss) {
  const float s = inv_sum * dloss;
  for (int v = 0; v < V; ++v) dl[v] += detail::exp_approx(l[v] - mx) * s;
}

}  // namespace

double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int N, int V, float dloss) {
  TROUPE_CHECK(N > 0 && V > 0, "N=", N, " V=", V);
  TROUPE_CHECK(logits && targets, "null tensor");
  double total = 0.0;
  for (int n = 0; n < N; ++n) {
    const int32_t y = targets[n];
    TROUPE_CHECK(y >= 0 && y < V, "target ", y, " of row ", n, " outside [0,", V, ")");
    const float* l = logits + size_t(n) * V;  // (V)
    const float mx = detail::lane_max(l, V);
    const float se = sum_exp(l, V, mx);  // in [1, V]: the max term is e^0
    total += std::log(double(se)) + double(mx) - double(l[y]);
    if (dlogits) {
      float* dl = dlogits + size_t(n) * V;  // (V)
      softmax_grad(dl, l, V, mx, 1.0f / se, dloss);
      dl[y] -= dloss;
    }
  }
  return total;
}

}  // namespace troupe::kernels::cpu
