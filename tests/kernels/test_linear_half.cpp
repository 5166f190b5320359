// The 16-bit linear of mixed precision (linear_forward_h / linear_backward_h): inputs
// and weights as bf16 or f16, products accumulated in f32. Checked against a double
// reference computed from the same rounded values, so the only error left is the f32
// accumulation; the backward's output gradient is rounded to the compute dtype first.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using troupe::DType;
using namespace troupe::kernels::test;

namespace {

uint16_t narrow(DType dt, float f) {
  return dt == DType::bf16 ? troupe::f32_to_bf16(f) : troupe::f32_to_f16(f);
}
double widen(DType dt, uint16_t h) {
  return dt == DType::bf16 ? troupe::bf16_to_f32(h) : troupe::f16_to_f32(h);
}

struct Half {
  std::vector<uint16_t> bits;
  std::vector<double> value;  // what the bits hold, exactly
};
Half rounded(DType dt, const std::vector<float>& x) {
  Half h;
  for (float f : x) {
    h.bits.push_back(narrow(dt, f));
    h.value.push_back(widen(dt, h.bits.back()));
  }
  return h;
}

// Each result sums K exact products (two 16-bit values multiply exactly in f32) and a
// start value in f32: whatever the order, |error| <= (K + 1) * 2^-24 * sum |terms|, the
// bound of recursive summation. That bound is the tolerance, per element.
void require_accumulated(const std::vector<float>& got, const std::vector<double>& want,
                         const std::vector<double>& abs_sum, int K, const char* what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = (K + 2) * std::ldexp(1.0, -24) * abs_sum[i] + 1e-30;
    if (!(std::fabs(double(got[i]) - want[i]) <= tol)) {
      INFO(what << "[" << i << "]: got " << got[i] << ", want " << want[i] << ", tolerance " << tol);
      REQUIRE(std::fabs(double(got[i]) - want[i]) <= tol);
    }
  }
}

const std::array<std::array<int, 3>, 5> kShapes = {
    {{13, 7, 5}, {1, 1, 1}, {2, 5, 1}, {6, 37, 19}, {33, 64, 48}}};

}  // namespace

TEST_CASE("16-bit linear forward equals a double reference of the rounded operands",
          "[kernels][linear][half]") {
  for (DType dt : {DType::bf16, DType::f16})
    for (auto [N, IC, OC] : kShapes)
      for (bool with_bias : {true, false}) {
        CAPTURE(troupe::dtype_name(dt), N, IC, OC, with_bias);
        const Half x = rounded(dt, random_vec(size_t(N) * IC, 1)),
                   w = rounded(dt, random_vec(size_t(OC) * IC, 2));
        const auto b = random_vec(OC, 3);
        std::vector<float> out(size_t(N) * OC, 123.0f);  // stale contents are overwritten
        k::linear_forward_h(dt, out.data(), x.bits.data(), w.bits.data(), with_bias ? b.data() : nullptr, N,
                            IC, OC);
        std::vector<double> want(out.size()), mag(out.size());
        for (int n = 0; n < N; ++n)
          for (int o = 0; o < OC; ++o) {
            double s = with_bias ? b[o] : 0.0, m = with_bias ? std::fabs(b[o]) : 0.0;
            for (int i = 0; i < IC; ++i) {
              const double p = x.value[size_t(n) * IC + i] * w.value[size_t(o) * IC + i];
              s += p;
              m += std::fabs(p);
            }
            want[size_t(n) * OC + o] = s;
            mag[size_t(n) * OC + o] = m;
          }
        require_accumulated(out, want, mag, IC, "out");
      }
}

TEST_CASE("16-bit linear backward rounds dout, then accumulates dinp, dweight and the f32 dbias",
          "[kernels][linear][half]") {
  for (DType dt : {DType::bf16, DType::f16})
    for (auto [N, IC, OC] : kShapes)
      for (bool overwrite : {true, false}) {
        CAPTURE(troupe::dtype_name(dt), N, IC, OC, overwrite);
        const Half x = rounded(dt, random_vec(size_t(N) * IC, 4)),
                   w = rounded(dt, random_vec(size_t(OC) * IC, 5));
        const auto dout = random_vec(size_t(N) * OC, 6);
        const Half dy = rounded(dt, dout);
        const auto dinp0 = random_vec(size_t(N) * IC, 7), dw0 = random_vec(size_t(OC) * IC, 8),
                   db0 = random_vec(OC, 9);
        std::vector<float> dinp = dinp0, dw = dw0, db = db0;
        std::vector<uint16_t> scratch(size_t(N) * OC);
        k::linear_backward_h(dt, dinp.data(), dw.data(), db.data(), dout.data(), scratch.data(),
                             x.bits.data(), w.bits.data(), N, IC, OC,
                             overwrite ? k::Out::overwrite : k::Out::accumulate);
        CHECK(scratch == dy.bits);  // the output gradient, rounded to nearest even
        std::vector<double> want_dinp(dinp.size()), mag_dinp(dinp.size());
        for (int n = 0; n < N; ++n)
          for (int i = 0; i < IC; ++i) {
            double s = overwrite ? 0.0 : dinp0[size_t(n) * IC + i], m = std::fabs(s);
            for (int o = 0; o < OC; ++o) {
              const double p = dy.value[size_t(n) * OC + o] * w.value[size_t(o) * IC + i];
              s += p;
              m += std::fabs(p);
            }
            want_dinp[size_t(n) * IC + i] = s;
            mag_dinp[size_t(n) * IC + i] = m;
          }
        require_accumulated(dinp, want_dinp, mag_dinp, OC, "dinp");
        std::vector<double> want_dw(dw.size()), mag_dw(dw.size());
        for (int o = 0; o < OC; ++o)
          for (int i = 0; i < IC; ++i) {
            double s = dw0[size_t(o) * IC + i], m = std::fabs(s);
            for (int n = 0; n < N; ++n) {
              const double p = dy.value[size_t(n) * OC + o] * x.value[size_t(n) * IC + i];
              s += p;
              m += std::fabs(p);
            }
            want_dw[size_t(o) * IC + i] = s;
            mag_dw[size_t(o) * IC + i] = m;
          }
        require_accumulated(dw, want_dw, mag_dw, N, "dweight");
        // The bias gradient sums the f32 dout, not its rounding.
        std::vector<double> want_db(db.size()), mag_db(db.size());
        for (int o = 0; o < OC; ++o) {
          double s = db0[o], m = std::fabs(s);
          for (int n = 0; n < N; ++n) {
            s += dout[size_t(n) * OC + o];
            m += std::fabs(dout[size_t(n) * OC + o]);
          }
          want_db[o] = s;
          mag_db[o] = m;
        }
        require_accumulated(db, want_db, mag_db, N, "dbias");
      }
}

TEST_CASE("the CPU kernel table has the 16-bit linear and rounding entries", "[kernels][half]") {
  const troupe::kernels::Kernels& t = troupe::kernels::cpu_kernels();
  CHECK(t.linear_forward_h == &k::linear_forward_h);
  CHECK(t.linear_backward_h == &k::linear_backward_h);
  REQUIRE(t.to_half != nullptr);
  std::vector<uint16_t> h(3);
  const float x[3] = {1.0f, 1.0f + 1.0f / 256, -3.5f};  // 1 + 2^-8 is a bf16 tie: rounds to even, 1
  t.to_half(DType::bf16, h.data(), x, 3);
  CHECK(h == std::vector<uint16_t>{0x3f80, 0x3f80, 0xc060});
}
