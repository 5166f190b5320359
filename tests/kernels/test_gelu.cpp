#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;

namespace {

// PyTorch's GELU(approximate='tanh'), element by element.
std::vector<double> ref_gelu(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  const double s = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(s * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

// Random values in [-6, 6) plus the points where tanh saturates or vanishes.
std::vector<float> gelu_inputs(size_t n, uint32_t seed) {
  auto x = random_vec(n, seed, -6.0f, 6.0f);
  for (float v : {0.0f, 1e-4f, -1e-4f, 9.5f, -9.5f, 30.0f, -30.0f, 1e4f, -1e4f}) x.push_back(v);
  return x;
}

}  // namespace

TEST_CASE("gelu forward matches the tanh formula in double", "[kernels][gelu]") {
  for (size_t n : {size_t(13), size_t(1), size_t(1000)}) {
    CAPTURE(n);
    const auto x = gelu_inputs(n, 1);
    std::vector<float> y(x.size());
    k::gelu_forward(y.data(), x.data(), x.size());
    const auto ref = ref_gelu(to_double(x));
    require_close(y, ref, 1e-5, 2e-6, "gelu");
    auto inplace = x;  // out == inp is allowed and gives the same bits
    k::gelu_forward(inplace.data(), inplace.data(), inplace.size());
    REQUIRE(inplace == y);
  }
}

TEST_CASE("gelu backward matches finite differences and accumulates", "[kernels][gelu]") {
  for (size_t n : {size_t(13), size_t(1), size_t(200)}) {
    CAPTURE(n);
    const auto x = gelu_inputs(n, 2);
    const auto R = random_vec(x.size(), 3);
    const auto g =
        finite_diff(to_double(x), [&](const std::vector<double>& v) { return weighted_sum(ref_gelu(v), R); });
    std::vector<float> dx(x.size(), 0.0f);
    k::gelu_backward(dx.data(), x.data(), R.data(), x.size());
    require_close(dx, g, kGradRtol, kGradAtol, "dgelu");
    const auto once = dx;
    k::gelu_backward(dx.data(), x.data(), R.data(), x.size());
    for (size_t i = 0; i < dx.size(); ++i) REQUIRE(dx[i] == Approx(2.0 * once[i]).margin(1e-7));
  }
}
