#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;

namespace {

struct RefLN {
  std::vector<double> out, mean, rstd;
};

// PyTorch LayerNorm over C: biased variance, eps = 1e-5 inside the square root.
RefLN ref_layernorm(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                    int N, int C) {
  RefLN r{std::vector<double>(x.size()), std::vector<double>(N), std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    const double* row = x.data() + size_t(n) * C;
    double mean = 0.0;
    for (int c = 0; c < C; ++c) mean += row[c];
    mean /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (row[c] - mean) * (row[c] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    for (int c = 0; c < C; ++c) r.out[size_t(n) * C + c] = (row[c] - mean) * rstd * w[c] + b[c];
    r.mean[n] = mean;
    r.rstd[n] = rstd;
  }
  return r;
}

// {N, C}
const std::array<std::array<int, 2>, 4> kShapes = {{{13, 7}, {1, 1}, {3, 33}, {2, 64}}};

}  // namespace

TEST_CASE("layernorm forward matches a double reference and saves mean/rstd", "[kernels][layernorm]") {
  for (auto [N, C] : kShapes)
    for (float offset : {0.0f, 100.0f}) {  // a large mean must not cost precision
      CAPTURE(N, C, offset);
      const auto x = random_vec(size_t(N) * C, 1, offset - 1.0f, offset + 1.0f);
      const auto w = random_vec(C, 2, 0.5f, 1.5f), b = random_vec(C, 3);
      std::vector<float> out(x.size()), mean(N), rstd(N);
      k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      const auto ref = ref_layernorm(to_double(x), to_double(w), to_double(b), N, C);
      const double tol = offset == 0.0f ? 1e-5 : 2e-4;  // float inputs near 100 carry ~4e-6 rounding
      require_close(out, ref.out, tol, tol, "layernorm out");
      require_close(mean, ref.mean, 1e-6, 1e-6, "mean");
      require_close(rstd, ref.rstd, tol, tol, "rstd");
    }
}

TEST_CASE("layernorm backward matches finite differences and accumulates", "[kernels][layernorm]") {
  for (auto [N, C] : kShapes) {
    CAPTURE(N, C);
    const auto x = random_vec(size_t(N) * C, 11), w = random_vec(C, 12, 0.5f, 1.5f), b = random_vec(C, 13);
    const auto R = random_vec(x.size(), 14);
    const auto dx = to_double(x), dw = to_double(w), db = to_double(b);
    const auto g_x = finite_diff(dx, [&](const std::vector<double>& v) {
      return weighted_sum(ref_layernorm(v, dw, db, N, C).out, R);
    });
    const auto g_w = finite_diff(dw, [&](const std::vector<double>& v) {
      return weighted_sum(ref_layernorm(dx, v, db, N, C).out, R);
    });
    const auto g_b = finite_diff(db, [&](const std::vector<double>& v) {
      return weighted_sum(ref_layernorm(dx, dw, v, N, C).out, R);
    });

    std::vector<float> out(x.size()), mean(N), rstd(N);
    k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    std::vector<float> dinp(x.size(), 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
    k::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), R.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
    require_close(dinp, g_x, kGradRtol, kGradAtol, "dinp");
    require_close(dweight, g_w, kGradRtol, kGradAtol, "dweight");
    require_close(dbias, g_b, kGradRtol, kGradAtol, "dbias");

    const auto once_x = dinp, once_w = dweight, once_b = dbias;
    k::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), R.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
    for (size_t i = 0; i < dinp.size(); ++i) REQUIRE(dinp[i] == Approx(2.0 * once_x[i]).margin(1e-6));
    for (int c = 0; c < C; ++c) {
      REQUIRE(dweight[c] == Approx(2.0 * once_w[c]).margin(1e-6));
      REQUIRE(dbias[c] == Approx(2.0 * once_b[c]).margin(1e-6));
    }
  }
}
