#include <catch2/catch.hpp>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;

// A sum or product of two floats is exact in double, so rounding the double result back to
// float gives exactly the correctly rounded float operation: the kernels must match bit for bit.
TEST_CASE("residual, add and scale match exact references", "[kernels][elementwise]") {
  for (size_t n : {size_t(0), size_t(1), size_t(13), size_t(1037)}) {
    CAPTURE(n);
    const auto a = random_vec(n, 1, -3.0f, 3.0f), b = random_vec(n, 2, -3.0f, 3.0f);
    std::vector<float> want_sum(n), want_scaled(n);
    for (size_t i = 0; i < n; ++i) {
      want_sum[i] = float(double(a[i]) + double(b[i]));
      want_scaled[i] = float(double(a[i]) * double(-0.37f));
    }

    std::vector<float> out(n, 9.0f);
    k::residual_forward(out.data(), a.data(), b.data(), n);
    REQUIRE(out == want_sum);

    auto in_place = a;  // out == a is allowed
    k::residual_forward(in_place.data(), in_place.data(), b.data(), n);
    REQUIRE(in_place == want_sum);

    auto y = a;
    k::add_inplace(y.data(), b.data(), n);
    REQUIRE(y == want_sum);

    auto z = a;
    k::scale_inplace(z.data(), -0.37f, n);
    REQUIRE(z == want_scaled);
  }
}
