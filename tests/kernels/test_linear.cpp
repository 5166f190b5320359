#include <array>
#include <catch2/catch.hpp>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;

namespace {

// out(N,OC) = inp(N,IC) @ w(OC,IC)^T + b(OC), b empty = no bias.
std::vector<double> ref_linear(const std::vector<double>& inp, const std::vector<double>& w,
                               const std::vector<double>& b, int N, int IC, int OC) {
  std::vector<double> out(size_t(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int i = 0; i < IC; ++i) s += inp[size_t(n) * IC + i] * w[size_t(o) * IC + i];
      out[size_t(n) * OC + o] = s;
    }
  return out;
}

const std::array<std::array<int, 3>, 4> kShapes = {{{13, 7, 5}, {1, 1, 1}, {2, 5, 1}, {6, 37, 19}}};

}  // namespace

TEST_CASE("linear forward matches a double reference", "[kernels][linear]") {
  for (auto [N, IC, OC] : kShapes)
    for (bool with_bias : {true, false}) {
      CAPTURE(N, IC, OC, with_bias);
      const auto inp = random_vec(size_t(N) * IC, 1), w = random_vec(size_t(OC) * IC, 2);
      const auto b = random_vec(OC, 3);
      std::vector<float> out(size_t(N) * OC, 123.0f);  // stale contents must be overwritten
      k::linear_forward(out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, N, IC, OC);
      const auto ref = ref_linear(to_double(inp), to_double(w),
                                  with_bias ? to_double(b) : std::vector<double>{}, N, IC, OC);
      require_close(out, ref, 1e-5, 1e-5, "linear out");
    }
}

TEST_CASE("linear backward matches finite differences and accumulates", "[kernels][linear]") {
  for (auto [N, IC, OC] : kShapes) {
    CAPTURE(N, IC, OC);
    const auto inp = random_vec(size_t(N) * IC, 11), w = random_vec(size_t(OC) * IC, 12);
    const auto b = random_vec(OC, 13), R = random_vec(size_t(N) * OC, 14);
    const auto di = to_double(inp), dw = to_double(w), db = to_double(b);

    const auto g_inp = finite_diff(
        di, [&](const std::vector<double>& x) { return weighted_sum(ref_linear(x, dw, db, N, IC, OC), R); });
    const auto g_w = finite_diff(
        dw, [&](const std::vector<double>& x) { return weighted_sum(ref_linear(di, x, db, N, IC, OC), R); });
    const auto g_b = finite_diff(
        db, [&](const std::vector<double>& x) { return weighted_sum(ref_linear(di, dw, x, N, IC, OC), R); });

    std::vector<float> dinp(inp.size(), 0.0f), dweight(w.size(), 0.0f), dbias(b.size(), 0.0f);
    k::linear_backward(dinp.data(), dweight.data(), dbias.data(), R.data(), inp.data(), w.data(), N, IC, OC);
    require_close(dinp, g_inp, kGradRtol, kGradAtol, "dinp");
    require_close(dweight, g_w, kGradRtol, kGradAtol, "dweight");
    require_close(dbias, g_b, kGradRtol, kGradAtol, "dbias");

    // Second call adds the same gradient again.
    const auto once_i = dinp, once_w = dweight, once_b = dbias;
    k::linear_backward(dinp.data(), dweight.data(), dbias.data(), R.data(), inp.data(), w.data(), N, IC, OC);
    for (size_t i = 0; i < dinp.size(); ++i) REQUIRE(dinp[i] == Approx(2.0 * once_i[i]).margin(1e-6));
    for (size_t i = 0; i < dweight.size(); ++i) REQUIRE(dweight[i] == Approx(2.0 * once_w[i]).margin(1e-6));
    for (size_t i = 0; i < dbias.size(); ++i) REQUIRE(dbias[i] == Approx(2.0 * once_b[i]).margin(1e-6));

    // Null gradients are skipped; the others are unaffected.
    std::vector<float> only_w(w.size(), 0.0f);
    k::linear_backward(nullptr, only_w.data(), nullptr, R.data(), inp.data(), w.data(), N, IC, OC);
    REQUIRE(only_w == once_w);
  }
}

TEST_CASE("linear rejects empty shapes and null tensors", "[kernels][linear]") {
  std::vector<float> x(4, 1.0f), out(4);
  REQUIRE_THROWS_AS(k::linear_forward(out.data(), x.data(), x.data(), nullptr, 0, 2, 2), troupe::Error);
  REQUIRE_THROWS_AS(k::linear_forward(out.data(), nullptr, x.data(), nullptr, 2, 2, 2), troupe::Error);
}
