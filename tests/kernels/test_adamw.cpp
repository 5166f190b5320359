#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;

namespace {

struct AdamW {
  double lr, beta1, beta2, eps, weight_decay;
};

// torch.optim.AdamW's single-tensor step, in double.
void ref_adamw_step(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                    std::vector<double>& v, const AdamW& o, int t) {
  const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1.0 - o.lr * o.weight_decay;
    m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g[i];
    v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g[i] * g[i];
    p[i] -= (o.lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
  }
}

}  // namespace

TEST_CASE("adamw follows torch.optim.AdamW over several steps", "[kernels][adamw]") {
  for (float wd : {0.0f, 0.1f})
    for (size_t n : {size_t(1), size_t(13), size_t(100)}) {
      CAPTURE(wd, n);
      const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
      const AdamW opt{lr, b1, b2, eps, wd};  // the float hyper-parameters, widened exactly
      auto p = random_vec(n, 1);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      auto rp = to_double(p);
      std::vector<double> rm(n, 0.0), rv(n, 0.0);
      for (int t = 1; t <= 6; ++t) {
        auto g = random_vec(n, 100 + t, -0.5f, 0.5f);
        if (t == 3) g[0] = 0.0f;  // a zero gradient still moves m, v and the decay
        k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, t);
        ref_adamw_step(rp, to_double(g), rm, rv, opt, t);
        CAPTURE(t);
        require_close(m, rm, 1e-5, 1e-8, "m");
        require_close(v, rv, 1e-5, 1e-10, "v");
        require_close(p, rp, 1e-5, 1e-7, "param");
      }
    }
}

TEST_CASE("adamw weight decay is decoupled from the gradient", "[kernels][adamw]") {
  // With zero gradient and zero moments the Adam part is 0 / eps = 0: only p *= 1 - lr*wd remains.
  // (Adam with an L2 term would instead take a normalized step of size ~lr.)
  auto p = random_vec(17, 7);
  const auto p0 = p;
  const std::vector<float> g(p.size(), 0.0f);
  std::vector<float> m(p.size(), 0.0f), v(p.size(), 0.0f);
  k::adamw_update(p.data(), g.data(), m.data(), v.data(), p.size(), 0.5f, 0.9f, 0.95f, 1e-8f, 0.2f, 1);
  for (size_t i = 0; i < p.size(); ++i)
    REQUIRE(p[i] == Approx(double(p0[i]) * (1.0 - 0.5 * 0.2)).epsilon(1e-6));
  // The first bias-corrected step has magnitude ~lr whatever the gradient scale.
  std::vector<float> q(4, 0.0f), gq = {1e-3f, -2.0f, 50.0f, -1e-2f}, mq(4, 0.0f), vq(4, 0.0f);
  k::adamw_update(q.data(), gq.data(), mq.data(), vq.data(), q.size(), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
  for (size_t i = 0; i < q.size(); ++i) REQUIRE(q[i] == Approx(gq[i] > 0 ? -1e-3 : 1e-3).epsilon(1e-4));
  REQUIRE_THROWS_AS(k::adamw_update(q.data(), gq.data(), mq.data(), vq.data(), q.size(), 1e-3f, 0.9f, 0.999f,
                                    1e-8f, 0.0f, 0),
                    troupe::Error);
}

TEST_CASE("sum_squares accumulates in double", "[kernels][adamw]") {
  REQUIRE(k::sum_squares(nullptr, 0) == 0.0);
  for (size_t n : {size_t(1), size_t(13), size_t(1001)}) {
    CAPTURE(n);
    const auto x = random_vec(n, 9, -3.0f, 3.0f);
    double ref = 0.0;
    for (float e : x) ref += double(e) * double(e);
    REQUIRE(k::sum_squares(x.data(), n) == Approx(ref).epsilon(1e-12));
  }
  // 1 + 2^24 copies of 2^-12 squared: a float accumulator would stall at 1.
  std::vector<float> x(size_t(1) << 24, 1.0f / 4096.0f);
  x[0] = 1.0f;
  REQUIRE(k::sum_squares(x.data(), x.size()) ==
          Approx(1.0 + double(x.size() - 1) / (4096.0 * 4096.0)).epsilon(1e-12));
}
