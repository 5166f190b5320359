// Causal attention: the fused kernels (flash_attention.cpp) and the materialized reference
// (attention.cpp) against a double implementation of the definition, against finite
// differences, and against each other: multi-head and grouped-query, T from 1 across the
// 64-row query blocks and 256-key blocks (odd T included), f32 within 1e-5, bf16 and f16
// within their rounding.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/support/support.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;
using troupe::DType;

namespace {

struct Shape {
  int B, T, NH, HS, NKV;  // NKV = 0: NH
  int kv() const { return NKV == 0 ? NH : NKV; }
  size_t qkv_size() const { return size_t(B) * T * (NH + 2 * kv()) * HS; }
  size_t out_size() const { return size_t(B) * T * NH * HS; }
  size_t lse_size() const { return size_t(B) * NH * T; }
};

struct RefAttention {
  std::vector<double> out, att, lse;  // (B,T,NH*HS), (B,NH,T,T), (B,NH,T)
};

// Straight from the definition: qkv(B,T,(NH+2*NKV)*HS) holds q heads, then k heads, then v
// heads; query head h reads key/value head h / (NH/NKV).
RefAttention ref_attention(const std::vector<double>& qkv, const Shape& s) {
  const int B = s.B, T = s.T, NH = s.NH, HS = s.HS, NKV = s.kv(), group = NH / NKV;
  const int C = NH * HS, ld = (NH + 2 * NKV) * HS;
  RefAttention r{std::vector<double>(s.out_size(), 0.0), std::vector<double>(size_t(B) * NH * T * T, 0.0),
                 std::vector<double>(s.lse_size(), 0.0)};
  const double scale = 1.0 / std::sqrt(double(HS));
  auto q = [&](int b, int t, int h, int i) { return qkv[(size_t(b) * T + t) * ld + h * HS + i]; };
  auto kk = [&](int b, int t, int g, int i) { return qkv[(size_t(b) * T + t) * ld + C + g * HS + i]; };
  auto v = [&](int b, int t, int g, int i) {
    return qkv[(size_t(b) * T + t) * ld + C + NKV * HS + g * HS + i];
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const int g = h / group;
        double* a = r.att.data() + ((size_t(b) * NH + h) * T + t) * T;
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          double dot = 0.0;
          for (int i = 0; i < HS; ++i) dot += q(b, t, h, i) * kk(b, u, g, i);
          a[u] = dot * scale;
          mx = std::max(mx, a[u]);
        }
        double sum = 0.0;
        for (int u = 0; u <= t; ++u) sum += std::exp(a[u] - mx);
        r.lse[(size_t(b) * NH + h) * T + t] = mx + std::log(sum);
        for (int u = 0; u <= t; ++u) a[u] = std::exp(a[u] - mx) / sum;
        for (int i = 0; i < HS; ++i) {
          double o = 0.0;
          for (int u = 0; u <= t; ++u) o += a[u] * v(b, u, g, i);
          r.out[(size_t(b) * T + t) * C + h * HS + i] = o;
        }
      }
  return r;
}

struct Fused {
  std::vector<float> out, lse;
};
Fused fused_forward(const std::vector<float>& qkv, const Shape& s) {
  Fused f{std::vector<float>(s.out_size(), 7.0f), std::vector<float>(s.lse_size(), 7.0f)};
  k::attention_forward(f.out.data(), f.lse.data(), qkv.data(), s.B, s.T, s.NH, s.HS, s.NKV);
  return f;
}

std::vector<float> nans(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

uint16_t round16(DType dt, float x) {
  return dt == DType::bf16 ? troupe::f32_to_bf16(x) : troupe::f32_to_f16(x);
}
float widen16(DType dt, uint16_t h) {
  return dt == DType::bf16 ? troupe::bf16_to_f32(h) : troupe::f16_to_f32(h);
}

// Shapes over the kernels' blocks: T = 1, odd, one query block, across several, across the
// 256-key block; multi-head and grouped-query; head sizes 1 .. 64.
const std::vector<Shape> kShapes = {{2, 5, 3, 5, 0},   {1, 1, 1, 1, 0},    {1, 70, 2, 4, 0},
                                    {2, 130, 1, 3, 0}, {1, 3, 2, 64, 0},   {1, 300, 4, 8, 2},
                                    {2, 65, 6, 4, 3},  {1, 257, 2, 16, 1}, {1, 513, 1, 8, 0}};

}  // namespace

TEST_CASE("fused attention forward matches a double reference: out and the log-sum-exp",
          "[kernels][attention]") {
  for (const Shape& s : kShapes) {
    CAPTURE(s.B, s.T, s.NH, s.HS, s.NKV);
    const auto qkv = random_vec(s.qkv_size(), 1u + s.T, -2.0f, 2.0f);
    const Fused f = fused_forward(qkv, s);
    const auto ref = ref_attention(to_double(qkv), s);
    require_close(f.out, ref.out, 1e-5, 2e-5, "fused out");
    require_close(f.lse, ref.lse, 1e-5, 1e-5, "fused lse");
    // Same inputs, same bits.
    const Fused again = fused_forward(qkv, s);
    REQUIRE(again.out == f.out);
    REQUIRE(again.lse == f.lse);
  }
}

TEST_CASE("materialized attention (the reference) matches the definition, att causal and stochastic",
          "[kernels][attention]") {
  for (const Shape& s :
       {Shape{2, 5, 3, 5, 0}, Shape{1, 70, 2, 4, 0}, Shape{2, 130, 1, 3, 0}, Shape{1, 66, 4, 4, 2}}) {
    CAPTURE(s.B, s.T, s.NH, s.HS, s.NKV);
    const auto qkv = random_vec(s.qkv_size(), 1, -2.0f, 2.0f);
    std::vector<float> out(s.out_size()), att(size_t(s.B) * s.NH * s.T * s.T, 5.0f);
    k::attention_materialized_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.HS, s.NKV);
    const auto ref = ref_attention(to_double(qkv), s);
    require_close(out, ref.out, 1e-5, 2e-5, "materialized out");
    require_close(att, ref.att, 1e-5, 1e-6, "att");
    for (size_t row = 0; row < size_t(s.B) * s.NH * s.T; ++row) {
      const int t = int(row % s.T);
      double sum = 0.0;
      for (int u = 0; u < s.T; ++u) {
        const float p = att[row * s.T + u];
        if (u > t) REQUIRE(p == 0.0f);
        sum += p;
      }
      REQUIRE(sum == Approx(1.0).margin(1e-5));
    }
  }
}

TEST_CASE("fused attention output at t does not depend on later tokens", "[kernels][attention]") {
  for (const Shape& s : {Shape{2, 5, 3, 5, 0}, Shape{1, 100, 2, 4, 0}, Shape{1, 300, 2, 4, 1}}) {
    const int C = s.NH * s.HS, ld = (s.NH + 2 * s.kv()) * s.HS, future = s.T / 2 + 1;
    CAPTURE(s.B, s.T, s.NH, s.HS, s.NKV, future);
    const auto qkv = random_vec(s.qkv_size(), 2);
    auto changed = qkv;
    const auto noise = random_vec(size_t(ld - C), 3, 1.0f, 3.0f);
    for (int b = 0; b < s.B; ++b)
      for (int i = 0; i < ld - C; ++i)
        changed[(size_t(b) * s.T + future) * ld + C + i] += noise[i];  // its k, v
    const Fused a = fused_forward(qkv, s), c = fused_forward(changed, s);
    bool later_changed = false;
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < s.T; ++t)
        for (int j = 0; j < C; ++j) {
          const size_t i = (size_t(b) * s.T + t) * C + j;
          if (t < future)
            REQUIRE(c.out[i] == a.out[i]);  // bit for bit: masked keys contribute nothing
          else
            later_changed = later_changed || c.out[i] != a.out[i];
        }
    REQUIRE(later_changed);
  }
}

TEST_CASE("fused attention backward matches finite differences and accumulates", "[kernels][attention]") {
  for (const Shape& s : {Shape{2, 5, 3, 5, 0}, Shape{1, 1, 1, 1, 0}, Shape{1, 67, 1, 3, 0},
                         Shape{2, 3, 1, 1, 0}, Shape{1, 9, 4, 3, 2}}) {
    CAPTURE(s.B, s.T, s.NH, s.HS, s.NKV);
    const auto qkv = random_vec(s.qkv_size(), 11);
    const auto R = random_vec(s.out_size(), 12);
    const auto g_qkv = finite_diff(to_double(qkv), [&](const std::vector<double>& x) {
      return weighted_sum(ref_attention(x, s).out, R);
    });
    const Fused f = fused_forward(qkv, s);
    std::vector<float> dqkv(s.qkv_size(), 0.0f);
    k::attention_backward(dqkv.data(), R.data(), qkv.data(), f.out.data(), f.lse.data(), s.B, s.T, s.NH, s.HS,
                          k::Out::accumulate, s.NKV);
    require_close(dqkv, g_qkv, kGradRtol, kGradAtol, "dqkv");
    const auto once = dqkv;
    k::attention_backward(dqkv.data(), R.data(), qkv.data(), f.out.data(), f.lse.data(), s.B, s.T, s.NH, s.HS,
                          k::Out::accumulate, s.NKV);
    for (size_t i = 0; i < dqkv.size(); ++i) REQUIRE(dqkv[i] == Approx(2.0 * once[i]).margin(1e-6));
  }
}

TEST_CASE("fused attention equals the materialized path, forward and backward, on every block shape",
          "[kernels][attention]") {
  for (const Shape& s : kShapes) {
    CAPTURE(s.B, s.T, s.NH, s.HS, s.NKV);
    const auto qkv = random_vec(s.qkv_size(), 21u + s.T), dout = random_vec(s.out_size(), 22u + s.T);
    const size_t n_att = size_t(s.B) * s.NH * s.T * s.T;
    std::vector<float> out(s.out_size()), att(n_att), scratch(n_att), want = nans(s.qkv_size());
    k::attention_materialized_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.HS, s.NKV);
    k::attention_materialized_backward(want.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B,
                                       s.T, s.NH, s.HS, k::Out::overwrite, s.NKV);
    const Fused f = fused_forward(qkv, s);
    require_close(f.out, out, 1e-5, 1e-6, "out");
    // Out::overwrite never reads dqkv (NaN stays out), and equals accumulating onto zeros.
    std::vector<float> got = nans(s.qkv_size()), acc(s.qkv_size(), 0.0f);
    k::attention_backward(got.data(), dout.data(), qkv.data(), f.out.data(), f.lse.data(), s.B, s.T, s.NH,
                          s.HS, k::Out::overwrite, s.NKV);
    k::attention_backward(acc.data(), dout.data(), qkv.data(), f.out.data(), f.lse.data(), s.B, s.T, s.NH,
                          s.HS, k::Out::accumulate, s.NKV);
    require_close(got, want, 1e-4, 1e-5, "dqkv");
    REQUIRE(got == acc);
  }
}

TEST_CASE("fused attention in bf16 and f16 follows f32 on the same rounded inputs within 16-bit rounding",
          "[kernels][attention][half]") {
  for (DType dt : {DType::bf16, DType::f16})
    for (const Shape& s :
         {Shape{2, 5, 3, 5, 0}, Shape{1, 130, 2, 16, 0}, Shape{1, 300, 4, 8, 2}, Shape{1, 257, 2, 64, 1}}) {
      CAPTURE(troupe::dtype_name(dt), s.B, s.T, s.NH, s.HS, s.NKV);
      auto qkv = random_vec(s.qkv_size(), 31u + s.T);
      std::vector<uint16_t> qkv_h(qkv.size());
      for (size_t i = 0; i < qkv.size(); ++i) {
        qkv_h[i] = round16(dt, qkv[i]);
        qkv[i] = widen16(dt, qkv_h[i]);  // the f32 run sees exactly the 16-bit inputs
      }
      const auto dout = random_vec(s.out_size(), 32u + s.T);
      const Fused f = fused_forward(qkv, s);
      std::vector<uint16_t> out_h(s.out_size());
      std::vector<float> lse(s.lse_size());
      k::attention_forward_h(dt, out_h.data(), lse.data(), qkv_h.data(), s.B, s.T, s.NH, s.HS, s.NKV);
      std::vector<float> out(out_h.size());
      for (size_t i = 0; i < out.size(); ++i) out[i] = widen16(dt, out_h[i]);
      // The probabilities are rounded before P v: one rounding of P, one of the output.
      const double eps = dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
      require_close(out, f.out, 2 * eps, 2 * eps, "16-bit out");
      require_close(lse, f.lse, 1e-5, 1e-5, "16-bit lse");  // f32 sums of exact 16-bit products
      // Backward against the f32 kernels on the same inputs and the same (rounded) output.
      std::vector<float> want(s.qkv_size()), got = nans(s.qkv_size());
      k::attention_backward(want.data(), dout.data(), qkv.data(), out.data(), f.lse.data(), s.B, s.T, s.NH,
                            s.HS, k::Out::overwrite, s.NKV);
      k::attention_backward_h(dt, got.data(), dout.data(), qkv_h.data(), out_h.data(), lse.data(), s.B, s.T,
                              s.NH, s.HS, k::Out::overwrite, s.NKV);
      double scale = 0;
      for (float x : want) scale = std::max(scale, double(std::fabs(x)));
      require_close(got, want, 8 * eps, 8 * eps * scale, "16-bit dqkv");
      // Deterministic.
      std::vector<uint16_t> out2(out_h.size());
      std::vector<float> lse2(lse.size()), got2 = nans(s.qkv_size());
      k::attention_forward_h(dt, out2.data(), lse2.data(), qkv_h.data(), s.B, s.T, s.NH, s.HS, s.NKV);
      k::attention_backward_h(dt, got2.data(), dout.data(), qkv_h.data(), out_h.data(), lse.data(), s.B, s.T,
                              s.NH, s.HS, k::Out::overwrite, s.NKV);
      REQUIRE(out2 == out_h);
      REQUIRE(lse2 == lse);
      REQUIRE(got2 == got);
    }
}

TEST_CASE("fused attention refuses bad shapes and dtypes", "[kernels][attention]") {
  std::vector<float> buf(64);
  std::vector<uint16_t> h(64);
  CHECK_THROWS_AS(k::attention_forward(buf.data(), buf.data(), buf.data(), 1, 0, 1, 1), troupe::Error);
  CHECK_THROWS_AS(k::attention_forward(buf.data(), buf.data(), buf.data(), 1, 2, 3, 1, 2), troupe::Error);
  CHECK_THROWS_AS(k::attention_forward(nullptr, buf.data(), buf.data(), 1, 2, 1, 1), troupe::Error);
  CHECK_THROWS_AS(k::attention_forward_h(DType::f32, h.data(), buf.data(), h.data(), 1, 2, 1, 1),
                  troupe::Error);
  CHECK_THROWS_AS(
      k::attention_backward_h(DType::i32, buf.data(), buf.data(), h.data(), h.data(), buf.data(), 1, 2, 1, 1),
      troupe::Error);
}

TEST_CASE(
    "fused attention in 16 bits is right on every GEMM path: forced convert, no AVX512-BF16, no AVX-512",
    "[kernels][attention][half]") {
  // Each environment in a fresh process of this executable (the GEMM choices are per process):
  // bf16 then runs on widened q|k|v (convert), or on oneDNN held below AVX512-BF16.
  for (const char* env :
       {"TROUPE_GEMM_HALF=convert", "TROUPE_MAX_CPU_ISA=avx512", "TROUPE_MAX_CPU_ISA=avx2"}) {
    INFO(env);
    const auto r =
        troupe::testing::run_command(std::string("env ") + env + " " + TROUPE_BINARY_DIR +
                                     "/tests/kernels/test_kernels 'fused attention in bf16 and f16*'");
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find("All tests passed") != std::string::npos);
  }
}
