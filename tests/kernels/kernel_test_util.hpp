// Helpers for the kernel tests: seeded random data, central finite differences in double,
// and element-wise comparison with a readable failure message.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace troupe::kernels::test {

// Uniform in [lo, hi), fixed seed: the same numbers on every run.
inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<int32_t> random_tokens(size_t n, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// L = sum(out * R): the scalar whose gradient the backward kernels compute when dout = R.
inline double weighted_sum(const std::vector<double>& out, const std::vector<float>& R) {
  REQUIRE(out.size() == R.size());
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * double(R[i]);
  return s;
}

// dL/dx by central differences, (L(x + h e_i) - L(x - h e_i)) / 2h for every i. In double,
// h = 1e-6 leaves truncation (~h^2) and rounding (~1e-16/h) errors far below float precision.
inline std::vector<double> finite_diff(std::vector<double> x,
                                       const std::function<double(const std::vector<double>&)>& L,
                                       double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + h;
    const double lp = L(x);
    x[i] = xi - h;
    const double lm = L(x);
    x[i] = xi;
    g[i] = (lp - lm) / (2.0 * h);
  }
  return g;
}

// Every |got - want| <= atol + rtol * |want|; reports the first offending index.
template <class A, class B>
void require_close(const std::vector<A>& got, const std::vector<B>& want, double rtol, double atol,
                   const char* what) {
  REQUIRE(got.size() == want.size());
  size_t bad = got.size();
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double tol = atol + rtol * std::fabs(double(want[i]));
    if (!(err <= tol) && bad == got.size()) bad = i;
    worst = std::max(worst, err);
  }
  INFO(what << ": max abs error " << worst);
  if (bad != got.size()) {
    INFO("first mismatch at " << bad << ": got " << double(got[bad]) << ", want " << double(want[bad]));
    REQUIRE(bad == got.size());
  }
  CHECK(bad == got.size());
}

// Gradients of the float kernels against finite differences of the double reference.
constexpr double kGradRtol = 1e-3;
constexpr double kGradAtol = 1e-4;

}  // namespace troupe::kernels::test
