// AdamW with torch.optim.AdamW's arithmetic, in its order: decoupled decay first, then the
// moment updates, then p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). The scalar factors
// are formed in double and rounded once, as PyTorch does with its Python-float scalars.
#include <cmath>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace troupe::kernels::cpu {

namespace {

TROUPE_VEC_CLONES void adamw_loop(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                  float* __restrict__ v, size_t n, float decay, float beta1, float beta2,
                                  float step_size, float bc2_sqrt, float eps) {
  const float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;
  for (size_t i = 0; i < n; ++i) {
    const float pi = p[i] * decay;
    const float mi = m[i] * beta1 + g[i] * one_minus_b1;
    const float vi = v[i] * beta2 + g[i] * g[i] * one_minus_b2;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * (mi / denom);
  }
}

}  // namespace

AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float weight_decay, int64_t t) {
  TROUPE_CHECK(t >= 1, "step count t is 1-based, got ", t);
  TROUPE_CHECK(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f, "beta1=", beta1,
               " beta2=", beta2);
  const double bc1 = 1.0 - std::pow(double(beta1), double(t));
  const double bc2 = 1.0 - std::pow(double(beta2), double(t));
  return {float(1.0 - double(lr) * double(weight_decay)), float(double(lr) / bc1), float(std::sqrt(bc2))};
}

// param, grad, m, v are (n); m and v start at zero before step t = 1.
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t) {
  const AdamWScalars s = adamw_scalars(lr, beta1, beta2, weight_decay, t);
  TROUPE_CHECK(n == 0 || (param && grad && m && v), "null tensor");
  adamw_loop(param, grad, m, v, n, s.decay, beta1, beta2, s.step_size, s.bc2_sqrt, eps);
}

// sum of x(n)^2; lane-wise partial sums in double, combined in a fixed order.
double sum_squares(const float* x, size_t n) {
  TROUPE_CHECK(n == 0 || x, "null tensor");
  constexpr int kL = 8;
  double acc[kL] = {};
  size_t i = 0;
  for (; i + kL <= n; i += kL)
    for (int j = 0; j < kL; ++j) acc[j] += double(x[i + j]) * double(x[i + j]);
  for (size_t j = 0; j < n - i && j < kL; ++j) acc[j] += double(x[i + j]) * double(x[i + j]);
  for (int w = kL / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

}  // namespace troupe::kernels::cpu
