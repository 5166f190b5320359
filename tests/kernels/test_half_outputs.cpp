// The 16-bit-output forms of LayerNorm, RMSNorm, GELU and SwiGLU (kernels/cpu/half_outputs.cpp)
// give, bit for bit, the fp32 kernel followed by to_half, and the same statistics: for bf16 and
// f16, sizes around the kernels' 64 KiB chunks (one row, odd widths, rows wider than a chunk).
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace k = troupe::kernels::cpu;
using namespace troupe::kernels::test;
using troupe::DType;

namespace {

std::vector<uint16_t> rounded(DType dt, const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  k::to_half(dt, h.data(), x.data(), x.size());
  return h;
}

struct Dims {
  int N, C;
};
const Dims kDims[] = {{1, 1}, {3, 17}, {257, 64}, {5, 20000}, {1000, 33}, {64, 4096}};

}  // namespace

TEST_CASE("16-bit outputs: layernorm and rmsnorm are the fp32 kernels then to_half, bit for bit",
          "[kernels][half]") {
  for (DType dt : {DType::bf16, DType::f16})
    for (const Dims d : kDims) {
      INFO(troupe::dtype_name(dt) << " N=" << d.N << " C=" << d.C);
      const size_t n = size_t(d.N) * d.C;
      const auto x = random_vec(n, 1u + d.C, -3.0f, 3.0f), w = random_vec(size_t(d.C), 2u),
                 b = random_vec(size_t(d.C), 3u);
      std::vector<float> y(n), mean(size_t(d.N)), rstd(size_t(d.N)), mean_h(size_t(d.N), 9.0f),
          rstd_h(size_t(d.N), 9.0f);
      std::vector<uint16_t> yh(n, 0xffff);
      k::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), d.N, d.C);
      k::layernorm_forward_h(dt, yh.data(), mean_h.data(), rstd_h.data(), x.data(), w.data(), b.data(), d.N,
                             d.C);
      REQUIRE(yh == rounded(dt, y));
      REQUIRE(mean_h == mean);
      REQUIRE(rstd_h == rstd);
      std::fill(yh.begin(), yh.end(), 0xffff);
      k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), d.N, d.C, 1e-6f);
      k::rmsnorm_forward_h(dt, yh.data(), rstd_h.data(), x.data(), w.data(), d.N, d.C, 1e-6f);
      REQUIRE(yh == rounded(dt, y));
      REQUIRE(rstd_h == rstd);
    }
}

TEST_CASE("16-bit outputs: gelu and swiglu are the fp32 kernels then to_half, bit for bit",
          "[kernels][half]") {
  for (DType dt : {DType::bf16, DType::f16})
    for (const Dims d : kDims) {
      INFO(troupe::dtype_name(dt) << " N=" << d.N << " C=" << d.C);
      const size_t n = size_t(d.N) * d.C;
      const auto x = random_vec(n, 4u + d.C, -6.0f, 6.0f), gu = random_vec(2 * n, 5u + d.C, -6.0f, 6.0f);
      std::vector<float> y(n);
      std::vector<uint16_t> yh(n, 0xffff);
      k::gelu_forward(y.data(), x.data(), n);
      k::gelu_forward_h(dt, yh.data(), x.data(), n);
      REQUIRE(yh == rounded(dt, y));
      std::fill(yh.begin(), yh.end(), 0xffff);
      k::swiglu_forward(y.data(), gu.data(), d.N, d.C);
      k::swiglu_forward_h(dt, yh.data(), gu.data(), d.N, d.C);
      REQUIRE(yh == rounded(dt, y));
    }
}

TEST_CASE("16-bit outputs refuse a dtype that is not 16-bit", "[kernels][half]") {
  std::vector<float> f(8);
  std::vector<uint16_t> h(8);
  CHECK_THROWS_AS(k::gelu_forward_h(DType::f32, h.data(), f.data(), 8), troupe::Error);
  CHECK_THROWS_AS(
      k::layernorm_forward_h(DType::i32, h.data(), f.data(), f.data(), f.data(), f.data(), f.data(), 2, 4),
      troupe::Error);
}
