#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;

namespace {

struct RefAttention {
  std::vector<double> out, att;  // (B,T,NH*HS), (B,NH,T,T)
};

// Straight from the definition: qkv(B,T,3*NH*HS) holds q heads, then k heads, then v heads.
RefAttention ref_attention(const std::vector<double>& qkv, int B, int T, int NH, int HS) {
  const int C = NH * HS;
  RefAttention r{std::vector<double>(size_t(B) * T * C, 0.0),
                 std::vector<double>(size_t(B) * NH * T * T, 0.0)};
  const double scale = 1.0 / std::sqrt(double(HS));
  auto at = [&](int b, int t, int part, int h, int i) {
    return qkv[(size_t(b) * T + t) * 3 * C + part * C + h * HS + i];
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double* a = r.att.data() + ((size_t(b) * NH + h) * T + t) * T;
        double mx = -1e300;
        for (int s = 0; s <= t; ++s) {
          double dot = 0.0;
          for (int i = 0; i < HS; ++i) dot += at(b, t, 0, h, i) * at(b, s, 1, h, i);
          a[s] = dot * scale;
          mx = std::max(mx, a[s]);
        }
        double sum = 0.0;
        for (int s = 0; s <= t; ++s) sum += (a[s] = std::exp(a[s] - mx));
        for (int s = 0; s <= t; ++s) a[s] /= sum;
        for (int i = 0; i < HS; ++i) {
          double o = 0.0;
          for (int s = 0; s <= t; ++s) o += a[s] * at(b, s, 2, h, i);
          r.out[(size_t(b) * T + t) * C + h * HS + i] = o;
        }
      }
  return r;
}

using Shape = std::array<int, 4>;  // {B, T, NH, HS}

}  // namespace

TEST_CASE("attention forward matches a double reference, att is causal and stochastic",
          "[kernels][attention]") {
  // T = 70 and 130 span several query blocks of the kernel.
  for (Shape s :
       {Shape{2, 5, 3, 5}, Shape{1, 1, 1, 1}, Shape{1, 70, 2, 4}, Shape{2, 130, 1, 3}, Shape{1, 3, 2, 64}}) {
    const auto [B, T, NH, HS] = s;
    CAPTURE(B, T, NH, HS);
    const auto qkv = random_vec(size_t(B) * T * 3 * NH * HS, 1, -2.0f, 2.0f);
    std::vector<float> out(size_t(B) * T * NH * HS), att(size_t(B) * NH * T * T, 5.0f);
    k::attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
    const auto ref = ref_attention(to_double(qkv), B, T, NH, HS);
    require_close(out, ref.out, 1e-5, 2e-5, "attention out");
    require_close(att, ref.att, 1e-5, 1e-6, "att");
    for (size_t row = 0; row < size_t(B) * NH * T; ++row) {
      const int t = int(row % T);
      double sum = 0.0;
      for (int u = 0; u < T; ++u) {
        const float p = att[row * T + u];
        if (u > t) REQUIRE(p == 0.0f);
        sum += p;
      }
      REQUIRE(sum == Approx(1.0).margin(1e-5));
    }
    // Same inputs, same bits.
    std::vector<float> out2(out.size()), att2(att.size());
    k::attention_forward(out2.data(), att2.data(), qkv.data(), B, T, NH, HS);
    REQUIRE(out2 == out);
    REQUIRE(att2 == att);
  }
}

TEST_CASE("attention output at t does not depend on later tokens", "[kernels][attention]") {
  for (Shape s : {Shape{2, 5, 3, 5}, Shape{1, 100, 2, 4}}) {
    const auto [B, T, NH, HS] = s;
    const int C = NH * HS, future = T / 2 + 1;
    CAPTURE(B, T, NH, HS, future);
    const auto qkv = random_vec(size_t(B) * T * 3 * C, 2);
    auto changed = qkv;
    const auto noise = random_vec(size_t(2) * C, 3, 1.0f, 3.0f);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < 2 * C; ++i)
        changed[(size_t(b) * T + future) * 3 * C + C + i] += noise[i];  // its k and v
    std::vector<float> out(size_t(B) * T * C), out2(out.size()), att(size_t(B) * NH * T * T),
        att2(att.size());
    k::attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
    k::attention_forward(out2.data(), att2.data(), changed.data(), B, T, NH, HS);
    bool later_changed = false;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c) {
          const size_t i = (size_t(b) * T + t) * C + c;
          if (t < future)
            REQUIRE(out2[i] == out[i]);  // bit for bit: masked entries contribute exact zeros
          else
            later_changed = later_changed || out2[i] != out[i];
        }
    REQUIRE(later_changed);
  }
}

TEST_CASE("attention backward matches finite differences and accumulates", "[kernels][attention]") {
  for (Shape s : {Shape{2, 5, 3, 5}, Shape{1, 1, 1, 1}, Shape{1, 67, 1, 3}, Shape{2, 3, 1, 1}}) {
    const auto [B, T, NH, HS] = s;
    CAPTURE(B, T, NH, HS);
    const size_t n_qkv = size_t(B) * T * 3 * NH * HS, n_att = size_t(B) * NH * T * T;
    const auto qkv = random_vec(n_qkv, 11);
    const auto R = random_vec(size_t(B) * T * NH * HS, 12);
    const auto g_qkv = finite_diff(to_double(qkv), [&](const std::vector<double>& x) {
      return weighted_sum(ref_attention(x, B, T, NH, HS).out, R);
    });

    std::vector<float> out(R.size()), att(n_att);
    k::attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
    // The scratch starts as NaN: the kernel must write every entry it reads.
    std::vector<float> scratch(n_att, std::numeric_limits<float>::quiet_NaN()), dqkv(n_qkv, 0.0f);
    k::attention_backward(dqkv.data(), scratch.data(), R.data(), qkv.data(), att.data(), B, T, NH, HS);
    require_close(dqkv, g_qkv, kGradRtol, kGradAtol, "dqkv");

    const auto once = dqkv;
    k::attention_backward(dqkv.data(), scratch.data(), R.data(), qkv.data(), att.data(), B, T, NH, HS);
    for (size_t i = 0; i < n_qkv; ++i) REQUIRE(dqkv[i] == Approx(2.0 * once[i]).margin(1e-6));
  }
}
