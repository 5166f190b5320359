#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;

namespace {

// Sum over rows of -log softmax(logits)[target], the plain way (log of a sum of exps) in double.
double ref_cross_entropy(const std::vector<double>& logits, const std::vector<int32_t>& targets, int N,
                         int V) {
  double total = 0.0;
  for (int n = 0; n < N; ++n) {
    const double* l = logits.data() + size_t(n) * V;
    double mx = l[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, l[v]);
    double s = 0.0;
    for (int v = 0; v < V; ++v) s += std::exp(l[v] - mx);
    total += mx + std::log(s) - l[targets[n]];
  }
  return total;
}

// {N, V}
const std::array<std::array<int, 2>, 4> kShapes = {{{13, 11}, {1, 1}, {1, 2}, {5, 256}}};

}  // namespace

TEST_CASE("cross_entropy of uniform logits is ln V per row", "[kernels][cross_entropy]") {
  for (auto [N, V] : kShapes) {
    CAPTURE(N, V);
    const std::vector<float> logits(size_t(N) * V, 0.75f);
    const auto targets = random_tokens(N, V, 1);
    REQUIRE(k::cross_entropy(nullptr, logits.data(), targets.data(), N, V, 1.0f) ==
            Approx(N * std::log(double(V))).margin(1e-6));
  }
}

TEST_CASE("cross_entropy matches a double reference, also for large logits", "[kernels][cross_entropy]") {
  for (auto [N, V] : kShapes)
    for (float offset : {0.0f, 1000.0f, -1000.0f}) {  // e^1000 overflows a naive softmax
      CAPTURE(N, V, offset);
      const auto logits = random_vec(size_t(N) * V, 2, offset - 4.0f, offset + 4.0f);
      const auto targets = random_tokens(N, V, 3);
      const double loss = k::cross_entropy(nullptr, logits.data(), targets.data(), N, V, 1.0f);
      REQUIRE(std::isfinite(loss));
      // Logits near 1000 carry float rounding of ~3e-5 each; the reference sees the same floats.
      REQUIRE(loss == Approx(ref_cross_entropy(to_double(logits), targets, N, V)).epsilon(1e-5).margin(1e-5));
    }
}

TEST_CASE("cross_entropy gradient matches finite differences, scales with dloss, accumulates",
          "[kernels][cross_entropy]") {
  for (auto [N, V] : kShapes) {
    CAPTURE(N, V);
    const auto logits = random_vec(size_t(N) * V, 4, -3.0f, 3.0f);
    const auto targets = random_tokens(N, V, 5);
    const float dloss = 0.25f;
    auto g = finite_diff(to_double(logits),
                         [&](const std::vector<double>& x) { return ref_cross_entropy(x, targets, N, V); });
    for (auto& x : g) x *= dloss;

    std::vector<float> dlogits(logits.size(), 0.0f);
    const double loss = k::cross_entropy(dlogits.data(), logits.data(), targets.data(), N, V, dloss);
    REQUIRE(loss == k::cross_entropy(nullptr, logits.data(), targets.data(), N, V,
                                     dloss));  // dloss only scales dlogits
    require_close(dlogits, g, kGradRtol, kGradAtol, "dlogits");

    // Each row of softmax - onehot sums to zero.
    for (int n = 0; n < N; ++n) {
      double s = 0.0;
      for (int v = 0; v < V; ++v) s += dlogits[size_t(n) * V + v];
      REQUIRE(s == Approx(0.0).margin(1e-6));
    }

    const auto once = dlogits;
    k::cross_entropy(dlogits.data(), logits.data(), targets.data(), N, V, dloss);
    for (size_t i = 0; i < dlogits.size(); ++i) REQUIRE(dlogits[i] == Approx(2.0 * once[i]).margin(1e-7));

    std::vector<float> unit(logits.size(), 0.0f);
    k::cross_entropy(unit.data(), logits.data(), targets.data(), N, V, 1.0f);
    for (size_t i = 0; i < unit.size(); ++i) REQUIRE(once[i] == Approx(dloss * unit[i]).margin(1e-7));
  }
}

TEST_CASE("cross_entropy rejects targets outside the vocabulary", "[kernels][cross_entropy]") {
  const std::vector<float> logits(6, 0.0f);
  for (int32_t bad : {-1, 3}) {
    const std::vector<int32_t> targets = {0, bad};
    REQUIRE_THROWS_AS(k::cross_entropy(nullptr, logits.data(), targets.data(), 2, 3, 1.0f), troupe::Error);
  }
}
