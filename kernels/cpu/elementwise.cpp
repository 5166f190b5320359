// Element-wise helpers. Exact aliasing (out == a, y == x) is allowed: no restrict here, the
// compiler vectorizes behind a runtime overlap check.
#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"

namespace troupe::kernels::cpu {

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  TROUPE_CHECK(n == 0 || (out && a && b), "null tensor");
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* y, const float* x, size_t n) {
  TROUPE_CHECK(n == 0 || (y && x), "null tensor");
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float s, size_t n) {
  TROUPE_CHECK(n == 0 || y, "null tensor");
  for (size_t i = 0; i < n; ++i) y[i] *= s;
}

}  // namespace troupe::kernels::cpu
