// Out::overwrite must give exactly what accumulating onto a zeroed buffer gives,
// without reading the buffer (it starts as NaN here), so that callers can drop
// the zero-fill pass.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;

namespace {

std::vector<float> nans(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

// Equal bits, except that +0 and -0 count as equal (0 + -0 is +0, a store of -0 is -0),
// and so do any two NaNs.
bool same_values(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_zero = a[i] == 0.0f && b[i] == 0.0f;
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    if (!both_zero && !both_nan && std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("linear backward overwrite equals accumulate onto zeros", "[kernels][linear]") {
  for (int N : {1, 37, 130})
    for (int IC : {3, 64, 401})
      for (int OC : {5, 96}) {
        INFO("N=" << N << " IC=" << IC << " OC=" << OC);
        const auto dout = random_vec(size_t(N) * OC, 1u + N), inp = random_vec(size_t(N) * IC, 2u + IC);
        const auto w = random_vec(size_t(OC) * IC, 3u + OC);
        std::vector<float> want(size_t(N) * IC, 0.0f), got = nans(size_t(N) * IC);
        std::vector<float> dw1(size_t(OC) * IC, 0.0f), dw2 = dw1, db1(size_t(OC), 0.0f), db2 = db1;
        k::linear_backward(want.data(), dw1.data(), db1.data(), dout.data(), inp.data(), w.data(), N, IC, OC);
        k::linear_backward(got.data(), dw2.data(), db2.data(), dout.data(), inp.data(), w.data(), N, IC, OC,
                           k::Out::overwrite);
        REQUIRE(same_values(want, got));
        REQUIRE(same_values(dw1, dw2));  // parameter gradients still accumulate
        REQUIRE(same_values(db1, db2));
      }
}

TEST_CASE("attention backward overwrite equals accumulate onto zeros", "[kernels][attention]") {
  // T crosses the 64-row query block and the 256-key block; heads and batches interleave in dqkv.
  for (int T : {1, 9, 64, 70, 130, 260}) {
    const int B = 2, NH = 3, HS = 16, C = NH * HS;
    INFO("T=" << T);
    const auto qkv = random_vec(size_t(B) * T * 3 * C, 4u + T), dout = random_vec(size_t(B) * T * C, 5u + T);
    std::vector<float> out(size_t(B) * T * C), lse(size_t(B) * NH * T);
    k::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, HS);
    std::vector<float> want(qkv.size(), 0.0f), got = nans(qkv.size());
    k::attention_backward(want.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, HS);
    k::attention_backward(got.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, HS,
                          k::Out::overwrite);
    REQUIRE(same_values(want, got));
  }
}

TEST_CASE("gelu backward in place equals accumulate onto zeros", "[kernels][gelu]") {
  for (size_t n : {size_t(1), size_t(17), size_t(1000)}) {
    const auto x = random_vec(n, 6u, -6.0f, 6.0f), d = random_vec(n, 7u);
    std::vector<float> want(n, 0.0f), got = d;
    k::gelu_backward(want.data(), x.data(), d.data(), n);
    k::gelu_backward_inplace(got.data(), x.data(), n);
    INFO("n=" << n);
    REQUIRE(same_values(want, got));
  }
}
