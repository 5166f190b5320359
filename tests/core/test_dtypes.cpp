// One DType everywhere (core/dtype.hpp) and its conversions (core/dtype_convert.hpp),
// each checked against a slow oracle: the nearest representable value found by
// comparing distances in double, ties to the even bit pattern.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "core/safetensors.hpp"

using namespace troupe;

namespace {

bool is_nan16(DType dt, uint16_t h) {
  return dt == DType::bf16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}

float widen(DType dt, uint16_t h) { return dt == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h); }
uint16_t narrow(DType dt, float f) { return dt == DType::bf16 ? f32_to_bf16(f) : f32_to_f16(f); }

// The oracle: among all finite 16-bit patterns of x's sign, the nearest to x (ties to the
// even pattern); beyond the largest finite value by half a step or more, inf. Patterns of
// one sign are monotonic in value, so a binary search finds the neighbours.
uint16_t nearest(DType dt, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(double(x));
  const uint16_t max_finite = dt == DType::bf16 ? 0x7f7f : 0x7bff;
  uint16_t lo = 0, hi = max_finite;  // largest pattern with value <= ax
  if (double(widen(dt, hi)) <= ax) {
    lo = hi;
  } else {
    while (hi - lo > 1) {
      const uint16_t mid = uint16_t((lo + hi) / 2);
      (double(widen(dt, mid)) <= ax ? lo : hi) = mid;
    }
  }
  if (lo == max_finite) {
    // The next step above max would be max + ulp: halfway or more rounds to inf.
    const double ulp = double(widen(dt, max_finite)) - double(widen(dt, max_finite - 1));
    const double v = double(widen(dt, max_finite));
    if (ax >= v + ulp / 2) return uint16_t(sign | (dt == DType::bf16 ? 0x7f80 : 0x7c00));
    if (ax > v) return uint16_t(sign | max_finite);
  }
  if (double(widen(dt, lo)) == ax) return uint16_t(sign | lo);
  const uint16_t up = uint16_t(lo + 1);
  const double dl = ax - double(widen(dt, lo)), du = double(widen(dt, up)) - ax;
  if (dl < du) return uint16_t(sign | lo);
  if (du < dl) return uint16_t(sign | up);
  return uint16_t(sign | ((lo & 1) ? up : lo));
}

}  // namespace

TEST_CASE("dtype: one enum for tensors, comm and files, with sizes and names", "[dtype]") {
  CHECK(dtype_size(DType::f64) == 8);
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(std::string(dtype_name(DType::f64)) == "f64");
  CHECK(is_floating(DType::bf16));
  CHECK_FALSE(is_floating(DType::i64));
  CHECK(is_valid(DType::f64));
  CHECK_FALSE(is_valid(static_cast<DType>(42)));
  static_assert(dtype_of<double>() == DType::f64, "dtype_of");
  static_assert(dtype_of<uint8_t>() == DType::u8, "dtype_of");
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    CHECK(safetensors::dtype_from_string(safetensors::dtype_to_string(dt)) == dt);
  CHECK(std::string(safetensors::dtype_to_string(DType::f64)) == "F64");
  CHECK(std::string(safetensors::dtype_to_string(DType::bf16)) == "BF16");
}

TEST_CASE("dtype: every bf16 and f16 pattern widens exactly and narrows back to itself", "[dtype]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    for (uint32_t h = 0; h <= 0xffff; ++h) {
      const uint16_t b = uint16_t(h);
      const float f = widen(dt, b);
      if (is_nan16(dt, b)) {
        REQUIRE(std::isnan(f));
        // NaN stays NaN, quiet, with its sign (a signalling payload gains the quiet bit).
        const uint16_t back = narrow(dt, f);
        REQUIRE(is_nan16(dt, back));
        REQUIRE((back & 0x8000) == (b & 0x8000));
        continue;
      }
      INFO("pattern " << h);
      REQUIRE(narrow(dt, f) == b);
    }
  }
}

TEST_CASE("dtype: f32 narrows to nearest, ties to even, like the oracle", "[dtype]") {
  std::mt19937 rng(7);
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           1.00390625f,  // 1 + 2^-8: a bf16 tie, rounds down to 1 (even)
                           1.01171875f,  // 1 + 3*2^-8: a bf16 tie, rounds up to 1 + 2^-6
                           65504.0f,
                           65519.99f,
                           65520.0f,  // f16: halfway past the largest finite -> inf
                           5.9604645e-8f,
                           2.9802322e-8f,  // 2^-25: f16 tie between 0 and the least subnormal
                           2.9802326e-8f,
                           6.1035156e-5f,
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  // Random bit patterns cover every exponent; random values near 1 cover the mantissa.
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> near(-4.0f, 4.0f);
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_to_f32(bits(rng));
    if (!std::isnan(f)) xs.push_back(f);
    xs.push_back(near(rng));
  }
  // Every tie of f16 around [1, 2) and at the subnormal boundary.
  for (uint32_t m = 0; m < 1024; ++m) {
    xs.push_back(bits_to_f32(0x3f800000u | (m << 13) | 0x1000u));
    xs.push_back(bits_to_f32(0x38800000u - (m << 13) - 0x1000u));
  }
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    for (float x : xs) {
      INFO("x = " << x << " bits " << f32_to_bits(x));
      REQUIRE(narrow(dt, x) == nearest(dt, x));
    }
  }
  CHECK(f32_to_bf16(1.00390625f) == 0x3f80);
  CHECK(f32_to_bf16(1.01171875f) == 0x3f82);
  CHECK(f32_to_f16(65520.0f) == 0x7c00);
  CHECK(f32_to_f16(65519.99f) == 0x7bff);
  CHECK(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);
}

TEST_CASE("dtype: a NaN narrows to a NaN, never to inf", "[dtype]") {
  // Payload only in the low bits that narrowing drops: truncation would give inf.
  for (uint32_t u : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f80ffffu, 0xffffffffu}) {
    const float f = bits_to_f32(u);
    REQUIRE(std::isnan(f));
    CHECK(is_nan16(DType::bf16, f32_to_bf16(f)));
    CHECK(is_nan16(DType::f16, f32_to_f16(f)));
    CHECK((f32_to_bf16(f) & 0x8000) == ((u >> 16) & 0x8000));
    CHECK(std::isnan(bf16_to_f32(f32_to_bf16(f))));
  }
}

TEST_CASE("dtype: convert moves arrays between the floating dtypes and refuses integers", "[dtype]") {
  const std::vector<float> src = {0.0f, -1.5f, 3.14159f, 1e-30f, 65504.0f, -2.5e38f};
  std::vector<uint16_t> b(src.size()), h(src.size());
  convert(DType::f32, src.data(), DType::bf16, b.data(), src.size());
  convert(DType::f32, src.data(), DType::f16, h.data(), src.size());
  std::vector<float> back(src.size());
  std::vector<double> d(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    CHECK(b[i] == f32_to_bf16(src[i]));
    CHECK(h[i] == f32_to_f16(src[i]));
  }
  convert(DType::bf16, b.data(), DType::f32, back.data(), b.size());
  for (size_t i = 0; i < src.size(); ++i) CHECK(back[i] == bf16_to_f32(b[i]));
  convert(DType::f16, h.data(), DType::f64, d.data(), h.size());
  for (size_t i = 0; i < src.size(); ++i) CHECK(d[i] == double(f16_to_f32(h[i])));
  convert(DType::f64, d.data(), DType::bf16, b.data(), d.size());
  for (size_t i = 0; i < src.size(); ++i) CHECK(b[i] == f32_to_bf16(float(d[i])));
  convert(DType::f32, src.data(), DType::f32, back.data(), src.size());
  CHECK(back == src);
  int32_t ints[2] = {1, 2};
  CHECK_THROWS_AS(convert(DType::i32, ints, DType::f32, back.data(), 2), Error);
  CHECK_THROWS_WITH(convert(DType::f32, src.data(), DType::u8, ints, 2), Catch::Contains("u8"));
}

TEST_CASE("safetensors: F64 tensors write and read back under their name", "[dtype][safetensors]") {
  const auto path =
      std::filesystem::temp_directory_path() / ("troupe_dtypes_" + std::to_string(::getpid()) + ".st");
  const std::vector<double> x = {0.1, -2.0, 1e300};
  safetensors::write(path.string(), {{"x", DType::f64, {3}, x.data()}});
  safetensors::Reader r(path.string());
  CHECK(r.info("x").dtype == DType::f64);
  const Tensor t = r.read("x");
  CHECK(t.dtype() == DType::f64);
  CHECK(t.data_as<double>()[2] == 1e300);
  std::filesystem::remove(path);
}
