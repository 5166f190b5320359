// 16-bit GEMM (kernels/cpu/gemm_half.hpp) and the conversions beside it.
//
//  * to_half / from_half against core/dtype_convert.hpp bit for bit: every 16-bit
//    pattern, every exponent with tie and boundary mantissas, random patterns.
//  * Every backend this CPU offers (convert always, avx512bf16 where the CPU has
//    it), and the packed bf16 loops through the scalar micro-kernel on every CPU,
//    against a double product of the same rounded 16-bit inputs: all transposes,
//    odd sizes around the 14x32 tile, blocks in every dimension, padded strides
//    (NaN in the padding of A and B, so a read of it shows), beta 0 over NaN,
//    beta 1, bias, M/N/K = 0. The scalar kernel also gives the exact bits of its
//    sums in the documented order (pairs high then low, 768-deep K blocks).
//  * TROUPE_GEMM_HALF parsing, argument errors, determinism.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "kernels/cpu/gemm_bf16_packed.hpp"
#include "kernels/cpu/gemm_dispatch.hpp"
#include "kernels/cpu/gemm_half.hpp"

namespace k = troupe::kernels::cpu;
namespace kd = troupe::kernels::cpu::detail;
using k::HalfGemmBackend;
using troupe::DType;

namespace {

uint16_t round16(DType dt, float x) {
  return dt == DType::bf16 ? troupe::f32_to_bf16(x) : troupe::f32_to_f16(x);
}
float widen16(DType dt, uint16_t h) {
  return dt == DType::bf16 ? troupe::bf16_to_f32(h) : troupe::f16_to_f32(h);
}
uint16_t nan16(DType dt) { return dt == DType::bf16 ? 0x7fc0 : 0x7e00; }

std::vector<float> random_f32(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// ---------------------------------------------------------------- GEMM harness

struct Case {
  bool ta, tb;
  int M, N, K;
  float beta;
  bool bias;
  int pad_a = 0, pad_b = 0, pad_c = 0;  // extra elements per row beyond the minimal stride
};

using RunFn = std::function<void(DType, const Case&, const uint16_t*, int, const uint16_t*, int, float*, int,
                                 const float*)>;
struct Runner {
  std::string name;
  RunFn run;
  bool scalar_model = false;  // also check the exact bits of the documented order
};

Runner backend_runner(HalfGemmBackend b) {
  return {k::half_gemm_backend_name(b),
          [b](DType dt, const Case& c, const uint16_t* A, int lda, const uint16_t* B, int ldb, float* C,
              int ldc, const float* bias) {
            k::gemm_half_with(b, dt, c.ta, c.tb, c.M, c.N, c.K, A, lda, B, ldb, c.beta, C, ldc, bias);
          }};
}

// The packed bf16 loops of the avx512bf16 backend with the scalar micro-kernel.
Runner scalar_model_runner() {
  return {"packed bf16 + scalar micro-kernel",
          [](DType, const Case& c, const uint16_t* A, int lda, const uint16_t* B, int ldb, float* C, int ldc,
             const float* bias) {
            kd::gemm_bf16_packed(kd::bf16_micro_kernel_scalar, c.ta, c.tb, c.M, c.N, c.K, A, lda, B, ldb,
                                 c.beta, C, ldc, bias);
          },
          true};
}

// Everything that runs dt here: the available backends, and for bf16 the scalar model.
std::vector<Runner> runners_for(DType dt) {
  std::vector<Runner> out;
  for (HalfGemmBackend b : {HalfGemmBackend::onednn, HalfGemmBackend::avx512bf16, HalfGemmBackend::convert})
    if (k::half_gemm_backend_available(b, dt)) out.push_back(backend_runner(b));
  if (dt == DType::bf16) out.push_back(scalar_model_runner());
  return out;
}

// Runs one case through every runner and checks all of C against a double product
// of the same 16-bit inputs, and that C's row padding is untouched.
void check_case(DType dt, const Case& c, const std::vector<Runner>& runners) {
  const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int lda = std::max(a_cols, 1) + c.pad_a, ldb = std::max(b_cols, 1) + c.pad_b,
            ldc = std::max(c.N, 1) + c.pad_c;
  // NaN everywhere, then random values in the matrix itself: padding stays NaN.
  std::vector<uint16_t> A(size_t(a_rows) * lda, nan16(dt)), B(size_t(b_rows) * ldb, nan16(dt));
  const auto av = random_f32(size_t(a_rows) * a_cols, 1u + c.M * 7u + c.K);
  const auto bv = random_f32(size_t(b_rows) * b_cols, 2u + c.N * 5u + c.K);
  for (int r = 0; r < a_rows; ++r)
    for (int q = 0; q < a_cols; ++q) A[size_t(r) * lda + q] = round16(dt, av[size_t(r) * a_cols + q]);
  for (int r = 0; r < b_rows; ++r)
    for (int q = 0; q < b_cols; ++q) B[size_t(r) * ldb + q] = round16(dt, bv[size_t(r) * b_cols + q]);
  const auto bias = random_f32(size_t(std::max(c.N, 1)), 3u + c.N);
  auto C0 = random_f32(size_t(c.M) * ldc, 4u + c.M + c.N);
  const float sentinel = 12345.0f;
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < ldc; ++j)
      if (j >= c.N)
        C0[size_t(i) * ldc + j] = sentinel;
      else if (c.beta == 0.0f)  // beta == 0 must not read C: a NaN would leak through 0 * NaN
        C0[size_t(i) * ldc + j] = std::numeric_limits<float>::quiet_NaN();

  auto a_at = [&](int i, int p) {
    return widen16(dt, c.ta ? A[size_t(p) * lda + i] : A[size_t(i) * lda + p]);
  };
  auto b_at = [&](int p, int j) {
    return widen16(dt, c.tb ? B[size_t(j) * ldb + p] : B[size_t(p) * ldb + j]);
  };
  // Widened once: (M,K) and (K,N), so the reference loops stay cheap.
  std::vector<float> Aw(size_t(c.M) * c.K), Bw(size_t(c.K) * c.N);
  for (int i = 0; i < c.M; ++i)
    for (int p = 0; p < c.K; ++p) Aw[size_t(i) * c.K + p] = a_at(i, p);
  for (int p = 0; p < c.K; ++p)
    for (int j = 0; j < c.N; ++j) Bw[size_t(p) * c.N + j] = b_at(p, j);

  std::vector<double> ref(size_t(c.M) * c.N), tol(ref.size());
  {
    std::vector<double> mag(ref.size());
    for (int i = 0; i < c.M; ++i)
      for (int p = 0; p < c.K; ++p) {
        const double a = Aw[size_t(i) * c.K + p];
        const float* brow = Bw.data() + size_t(p) * c.N;
        double* r = ref.data() + size_t(i) * c.N;
        double* m = mag.data() + size_t(i) * c.N;
        for (int j = 0; j < c.N; ++j) {
          r[j] += a * brow[j];
          m[j] += std::fabs(a * brow[j]);
        }
      }
    for (int i = 0; i < c.M; ++i)
      for (int j = 0; j < c.N; ++j) {
        double& r = ref[size_t(i) * c.N + j];
        double m = mag[size_t(i) * c.N + j];
        const double add = c.bias ? bias[j] : c.beta != 0.0f ? C0[size_t(i) * ldc + j] : 0.0;
        r += add;
        m += std::fabs(add);
        // Products of 16-bit values are exact in fp32; each of the K + 1 sums rounds
        // by at most 2^-24 of the magnitudes summed so far (twice that, for margin).
        tol[size_t(i) * c.N + j] = 2.0 * std::ldexp(1.0, -24) * (c.K + 2) * m + 1e-30;
      }
  }

  for (const Runner& run : runners) {
    INFO("runner=" << run.name << " dtype=" << troupe::dtype_name(dt) << " ta=" << c.ta << " tb=" << c.tb
                   << " M=" << c.M << " N=" << c.N << " K=" << c.K << " lda=" << lda << " ldb=" << ldb
                   << " ldc=" << ldc << " beta=" << c.beta << " bias=" << c.bias);
    auto C = C0;
    run.run(dt, c, A.data(), lda, B.data(), ldb, C.data(), ldc, c.bias ? bias.data() : nullptr);
    int bad = 0;
    for (int i = 0; i < c.M; ++i) {
      for (int j = 0; j < c.N; ++j) {
        const double got = C[size_t(i) * ldc + j], want = ref[size_t(i) * c.N + j];
        if (!(std::fabs(got - want) <= tol[size_t(i) * c.N + j]) && bad++ < 5)
          FAIL_CHECK("C(" << i << "," << j << ")=" << got << " ref=" << want);
      }
      for (int j = c.N; j < ldc; ++j)
        if (C[size_t(i) * ldc + j] != sentinel && bad++ < 5)
          FAIL_CHECK("padding of C row " << i << " written");
    }
    if (run.scalar_model) {
      // The scalar kernel's documented order, element by element: per 768-deep K
      // block, from 0, per pair the high product then the low one (an odd last k
      // pairs with 0); the first block lands on 0, old C or the bias, later blocks
      // add to it.
      for (int i = 0; i < c.M; ++i)
        for (int j = 0; j < c.N; ++j) {
          float out = 0.0f;
          for (int pc = 0; pc < c.K; pc += kd::kBf16KC) {
            const int kc = std::min(kd::kBf16KC, c.K - pc);
            float acc = 0.0f;
            for (int p = 0; 2 * p < kc; ++p) {
              const int k0 = pc + 2 * p, k1 = k0 + 1;
              const bool has1 = 2 * p + 1 < kc;
              acc += (has1 ? Aw[size_t(i) * c.K + k1] : 0.0f) * (has1 ? Bw[size_t(k1) * c.N + j] : 0.0f);
              acc += Aw[size_t(i) * c.K + k0] * Bw[size_t(k0) * c.N + j];
            }
            if (pc > 0)
              out = out + acc;
            else if (c.bias)
              out = acc + bias[j];
            else
              out = c.beta != 0.0f ? C0[size_t(i) * ldc + j] + acc : acc;
          }
          const float got = C[size_t(i) * ldc + j];
          if (std::memcmp(&got, &out, sizeof got) != 0 && bad++ < 5)
            FAIL_CHECK("C(" << i << "," << j << ")=" << got << " is not the bits of the ordered sum " << out);
        }
    }
    REQUIRE(bad == 0);
  }
}

}  // namespace

// ---------------------------------------------------------------- conversions

TEST_CASE("from_half widens all 65536 bf16 and f16 patterns with the bits of dtype_convert",
          "[kernels][gemm_half]") {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO("dtype=" << troupe::dtype_name(dt));
    std::vector<float> got(all.size());
    k::from_half(dt, got.data(), all.data(), all.size());
    int bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      const float want = widen16(dt, all[h]);
      if (std::memcmp(&got[h], &want, sizeof want) != 0 && bad++ < 5)
        FAIL_CHECK("pattern 0x" << std::hex << h << ": got 0x" << troupe::f32_to_bits(got[h]) << " want 0x"
                                << troupe::f32_to_bits(want));
    }
    REQUIRE(bad == 0);
  }
}

TEST_CASE("to_half rounds every class of f32 with the bits of dtype_convert", "[kernels][gemm_half]") {
  std::vector<uint32_t> bits;
  // Every sign, exponent and top-7 mantissa (the high 16 bits), each with low halves
  // that sit on and next to every rounding point: bf16 drops the low 16 bits, f16
  // 13 (normal) to 24 (subnormal), so ties, just-below and just-above for each bit,
  // with the kept bit even and odd.
  std::vector<uint32_t> lows = {0x0000, 0x0001, 0xffff};
  for (int b = 0; b < 16; ++b) {
    const uint32_t p = 1u << b;
    for (uint32_t lo : {p, p - 1, p + 1, p | (p << 1), (p | (p << 1)) - 1, (p | (p << 1)) + 1})
      lows.push_back(lo & 0xffffu);
  }
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : lows) bits.push_back(hi << 16 | lo);
  // Named boundaries: zeros, infinities, NaNs (quiet, signalling, payloads), f32
  // subnormals, the f16 overflow and subnormal thresholds, FLT_MAX.
  for (uint32_t u : {0x00000000u, 0x7f800000u, 0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffffffu,
                     0x7f802000u, 0x7f801fffu, 0x7fa00000u, 0x00000001u, 0x007fffffu, 0x00800000u,
                     0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x477fe000u, 0x477fefffu, 0x477ff000u,
                     0x477fe001u, 0x38800000u, 0x387fffffu, 0x387fe000u, 0x387ff000u, 0x33800000u,
                     0x33000000u, 0x33000001u, 0x32ffffffu, 0x33400000u, 0x33c00000u})
    for (uint32_t sign : {0u, 0x80000000u}) bits.push_back(u | sign);
  std::mt19937 gen(7);
  for (int i = 0; i < (1 << 21); ++i) bits.push_back(gen());
  // Values of the f16 subnormal range, where the dropped width varies with the exponent.
  std::uniform_int_distribution<uint32_t> sub(0x32800000u, 0x38800000u);
  for (int i = 0; i < (1 << 19); ++i) bits.push_back(sub(gen) | (gen() & 0x80000000u));

  std::vector<float> src(bits.size());
  std::memcpy(src.data(), bits.data(), sizeof(float) * bits.size());
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO("dtype=" << troupe::dtype_name(dt) << " values=" << src.size());
    std::vector<uint16_t> got(src.size());
    k::to_half(dt, got.data(), src.data(), src.size());
    int bad = 0;
    for (size_t i = 0; i < src.size(); ++i) {
      const uint16_t want = round16(dt, src[i]);
      if (got[i] != want && bad++ < 5)
        FAIL_CHECK("f32 0x" << std::hex << bits[i] << ": got 0x" << got[i] << " want 0x" << want);
    }
    REQUIRE(bad == 0);
  }
}

TEST_CASE("to_half and from_half convert exactly n values at any alignment", "[kernels][gemm_half]") {
  std::mt19937 gen(3);
  std::vector<uint32_t> bits(64);
  for (auto& u : bits) u = gen();
  bits[5] = 0x7f800001u;  // a signalling NaN inside the vector part
  std::vector<float> src(bits.size());
  std::memcpy(src.data(), bits.data(), sizeof(float) * bits.size());
  for (DType dt : {DType::bf16, DType::f16})
    for (size_t off = 0; off < 4; ++off)
      for (size_t n = 0; n + off <= 44; ++n) {
        INFO("dtype=" << troupe::dtype_name(dt) << " offset=" << off << " n=" << n);
        std::vector<uint16_t> h(48, 0xabcd);
        k::to_half(dt, h.data() + off, src.data() + off, n);
        for (size_t i = 0; i < h.size(); ++i)
          REQUIRE(h[i] == (i >= off && i < off + n ? round16(dt, src[i]) : 0xabcd));
        std::vector<uint16_t> in(48);
        for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(gen());
        in[off + 2] = dt == DType::bf16 ? 0x7f81 : 0x7c01;  // signalling NaN patterns
        std::vector<float> f(48, -3.0f);
        k::from_half(dt, f.data() + off, in.data() + off, n);
        for (size_t i = 0; i < f.size(); ++i) {
          const float want = i >= off && i < off + n ? widen16(dt, in[i]) : -3.0f;
          REQUIRE(troupe::f32_to_bits(f[i]) == troupe::f32_to_bits(want));
        }
      }
  REQUIRE_THROWS_AS(k::to_half(DType::f32, nullptr, nullptr, 0), troupe::Error);
  REQUIRE_THROWS_AS(k::from_half(DType::i32, nullptr, nullptr, 0), troupe::Error);
}

// ---------------------------------------------------------------- dispatch

TEST_CASE("TROUPE_GEMM_HALF names a backend and the default is available", "[kernels][gemm_half]") {
  const bool bf16_dot = k::half_gemm_backend_available(HalfGemmBackend::avx512bf16, DType::bf16);
  CHECK(std::string(k::half_gemm_backend_name(HalfGemmBackend::avx512bf16)) == "avx512bf16");
  CHECK(std::string(k::half_gemm_backend_name(HalfGemmBackend::convert)) == "convert");
  CHECK(k::half_gemm_backend_available(HalfGemmBackend::convert, DType::bf16));
  CHECK(k::half_gemm_backend_available(HalfGemmBackend::convert, DType::f16));
  CHECK_FALSE(k::half_gemm_backend_available(HalfGemmBackend::avx512bf16, DType::f16));
  CHECK_FALSE(k::half_gemm_backend_available(HalfGemmBackend::convert, DType::f32));

  const HalfGemmBackend fastest = bf16_dot ? HalfGemmBackend::avx512bf16 : HalfGemmBackend::convert;
  CHECK(k::half_gemm_backend_for(nullptr, DType::bf16) == fastest);
  CHECK(k::half_gemm_backend_for("", DType::bf16) == fastest);
  CHECK(k::half_gemm_backend_for(nullptr, DType::f16) == HalfGemmBackend::convert);
  CHECK(k::half_gemm_backend_for("convert", DType::bf16) == HalfGemmBackend::convert);
  CHECK(k::half_gemm_backend_for("convert", DType::f16) == HalfGemmBackend::convert);
  if (bf16_dot)
    CHECK(k::half_gemm_backend_for("avx512bf16", DType::bf16) == HalfGemmBackend::avx512bf16);
  else
    CHECK_THROWS_WITH(k::half_gemm_backend_for("avx512bf16", DType::bf16),
                      Catch::Contains("TROUPE_GEMM_HALF=avx512bf16 is not available for bf16"));
  CHECK_THROWS_WITH(k::half_gemm_backend_for("avx512bf16", DType::f16),
                    Catch::Contains("TROUPE_GEMM_HALF=avx512bf16 is not available for f16"));
  CHECK_THROWS_WITH(k::half_gemm_backend_for("AVX512BF16", DType::bf16),
                    Catch::Contains("is not one of avx512bf16, convert, onednn"));
  CHECK_THROWS_WITH(k::half_gemm_backend_for("openblas", DType::f16),
                    Catch::Contains("is not one of avx512bf16, convert, onednn"));
  CHECK_THROWS_AS(k::half_gemm_backend_for("convert", DType::f32), troupe::Error);

  for (DType dt : {DType::bf16, DType::f16}) {
    const HalfGemmBackend d = k::half_gemm_default_backend(dt);
    CHECK(k::half_gemm_backend_available(d, dt));
    CHECK(d == k::half_gemm_backend_for(std::getenv("TROUPE_GEMM_HALF"), dt));
  }
}

// ---------------------------------------------------------------- packing

TEST_CASE("bf16 panels hold k-pairs, low half even k, zero padded", "[kernels][gemm_half]") {
  // Raw 16-bit codes (packing moves bits only): element (r, k) = 0x100 * (r + 1) + k + 1.
  const int h = 3, kc = 5, kp = 3;
  auto code = [](int r, int kk) { return static_cast<uint16_t>(0x100 * (r + 1) + kk + 1); };
  for (bool trans : {false, true}) {
    INFO("trans=" << trans);
    const int ld = trans ? h + 2 : kc + 3;
    std::vector<uint16_t> a(size_t(trans ? kc : h) * ld, 0xffff);
    for (int i = 0; i < h; ++i)
      for (int kk = 0; kk < kc; ++kk) a[trans ? size_t(kk) * ld + i : size_t(i) * ld + kk] = code(i, kk);
    std::vector<uint32_t> ap(size_t(kp) * kd::kBf16MR, 0xdeadbeef);
    kd::pack_a_bf16(a.data(), ld, trans, h, kc, ap.data());
    for (int p = 0; p < kp; ++p)
      for (int i = 0; i < kd::kBf16MR; ++i) {
        const uint32_t lo = i < h ? code(i, 2 * p) : 0;
        const uint32_t hi = i < h && 2 * p + 1 < kc ? code(i, 2 * p + 1) : 0;
        REQUIRE(ap[size_t(p) * kd::kBf16MR + i] == (lo | hi << 16));
      }
    // B: op(B)(kc, w), column j plays the role of row r.
    const int w = 3, ldb = trans ? kc + 1 : w + 4;
    std::vector<uint16_t> b(size_t(trans ? w : kc) * ldb, 0xffff);
    for (int kk = 0; kk < kc; ++kk)
      for (int j = 0; j < w; ++j) b[trans ? size_t(j) * ldb + kk : size_t(kk) * ldb + j] = code(j, kk);
    std::vector<uint32_t> bp(size_t(kp) * kd::kBf16NR, 0xdeadbeef);
    kd::pack_b_bf16(b.data(), ldb, trans, w, kc, bp.data());
    for (int p = 0; p < kp; ++p)
      for (int j = 0; j < kd::kBf16NR; ++j) {
        const uint32_t lo = j < w ? code(j, 2 * p) : 0;
        const uint32_t hi = j < w && 2 * p + 1 < kc ? code(j, 2 * p + 1) : 0;
        REQUIRE(bp[size_t(p) * kd::kBf16NR + j] == (lo | hi << 16));
      }
  }
}

// ---------------------------------------------------------------- GEMM

TEST_CASE("gemm_half matches a double reference: small shapes, transposes, beta and bias",
          "[kernels][gemm_half]") {
  const bool bf16_dot = k::half_gemm_backend_available(HalfGemmBackend::avx512bf16, DType::bf16);
  WARN("16-bit GEMM here: convert"
       << (bf16_dot
               ? " and avx512bf16 (AVX512-BF16 present)"
               : "; no AVX512-BF16, so avx512bf16's packing and loops ran through the scalar micro-kernel "
                 "only"));
  // Around the 14x32 tile and the k-pairs: odd K, K = 1, K = 2, one K block and one past.
  const int shapes[][3] = {{1, 1, 1},    {13, 37, 29}, {14, 32, 2}, {15, 33, 1},
                           {29, 65, 31}, {3, 5, 768},  {7, 9, 769}};
  for (DType dt : {DType::bf16, DType::f16}) {
    const auto runners = runners_for(dt);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const auto& s : shapes)
          for (int mode = 0; mode < 3; ++mode)  // beta 0, beta 1, bias
            check_case(
                dt,
                {ta, tb, s[0], s[1], s[2], mode == 1 ? 1.0f : 0.0f, mode == 2, ta ? 3 : 1, tb ? 0 : 2, mode},
                runners);
  }
}

TEST_CASE("gemm_half matches a double reference on shapes past one block in each dimension",
          "[kernels][gemm_half]") {
  // 300x700x500: several tiles and column blocks everywhere. K = 1537 crosses two
  // 768-deep K blocks (odd tail); M = 4100 crosses the 4088-row A block of the packed
  // loops; N = 2100 and M = 2100 cross the 2048 blocks that convert widens.
  const Case cases[] = {
      {false, true, 300, 700, 500, 0.0f, false, 5, 3, 1},  {true, false, 300, 700, 500, 1.0f, false, 0, 0, 0},
      {false, false, 31, 530, 1537, 1.0f, false, 1, 1, 1}, {true, true, 33, 47, 1537, 0.0f, true, 2, 0, 3},
      {false, true, 4100, 33, 3, 0.0f, true, 0, 1, 0},     {true, false, 4100, 5, 9, 1.0f, false, 1, 0, 2},
      {false, false, 20, 2100, 37, 0.0f, true, 0, 0, 0},   {true, false, 9, 2100, 800, 1.0f, false, 1, 2, 3},
      {true, true, 2100, 20, 9, 0.0f, false, 3, 3, 3},
  };
  for (DType dt : {DType::bf16, DType::f16}) {
    const auto runners = runners_for(dt);
    for (const Case& c : cases) check_case(dt, c, runners);
  }
}

TEST_CASE("gemm_half with M, N or K == 0 touches only what it must", "[kernels][gemm_half]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dt : {DType::bf16, DType::f16})
    for (HalfGemmBackend b : {HalfGemmBackend::avx512bf16, HalfGemmBackend::convert}) {
      if (!k::half_gemm_backend_available(b, dt)) continue;
      INFO("backend=" << k::half_gemm_backend_name(b) << " dtype=" << troupe::dtype_name(dt));
      const int M = 3, N = 5, ldc = 6;
      const std::vector<uint16_t> A(64, nan16(dt)), B(64, nan16(dt));
      const std::vector<float> bias = {1, 2, 3, 4, 5};
      // M == 0 or N == 0: nothing is read or written.
      std::vector<float> C(M * ldc, 7.0f);
      k::gemm_half_with(b, dt, false, false, 0, N, 4, A.data(), 4, B.data(), N, 0.0f, C.data(), ldc);
      k::gemm_half_with(b, dt, true, true, M, 0, 4, A.data(), M, B.data(), 4, 1.0f, C.data(), ldc);
      k::gemm_half_with(b, dt, false, false, 0, 0, 0, nullptr, 1, nullptr, 1, 0.0f, nullptr, 1, nullptr);
      for (float x : C) REQUIRE(x == 7.0f);
      // K == 0: C = 0 (beta 0, C not read), unchanged (beta 1), or the bias rows; A and B unread.
      std::fill(C.begin(), C.end(), nan);
      k::gemm_half_with(b, dt, false, false, M, N, 0, nullptr, 1, nullptr, N, 0.0f, C.data(), ldc);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) REQUIRE(C[i * ldc + j] == 0.0f);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) C[i * ldc + j] = float(i + j);
      k::gemm_half_with(b, dt, true, false, M, N, 0, A.data(), M, B.data(), N, 1.0f, C.data(), ldc);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) REQUIRE(C[i * ldc + j] == float(i + j));
      k::gemm_half_with(b, dt, false, true, M, N, 0, A.data(), 1, B.data(), 1, 0.0f, C.data(), ldc,
                        bias.data());
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) REQUIRE(C[i * ldc + j] == bias[j]);
      for (int i = 0; i < M; ++i) REQUIRE(std::isnan(C[i * ldc + N]));  // padding untouched
    }
}

TEST_CASE("gemm_half refuses bad arguments with troupe::Error", "[kernels][gemm_half]") {
  std::vector<uint16_t> A(64), B(64);
  std::vector<float> C(64), bias(8);
  auto call = [&](HalfGemmBackend b, DType dt, int lda, float beta, const float* bi) {
    k::gemm_half_with(b, dt, false, false, 4, 4, 4, A.data(), lda, B.data(), 4, beta, C.data(), 4, bi);
  };
  const auto conv = HalfGemmBackend::convert;
  REQUIRE_NOTHROW(call(conv, DType::bf16, 4, 1.0f, nullptr));
  REQUIRE_THROWS_WITH(call(conv, DType::bf16, 4, 0.5f, nullptr), Catch::Contains("is not 0 or 1"));
  REQUIRE_THROWS_WITH(call(conv, DType::f16, 4, 1.0f, bias.data()),
                      Catch::Contains("a bias requires beta == 0"));
  REQUIRE_THROWS_WITH(call(conv, DType::bf16, 3, 0.0f, nullptr), Catch::Contains("lda=3 too small"));
  REQUIRE_THROWS_WITH(call(conv, DType::f32, 4, 0.0f, nullptr), Catch::Contains("is not bf16 or f16"));
  REQUIRE_THROWS_WITH(call(HalfGemmBackend::avx512bf16, DType::f16, 4, 0.0f, nullptr),
                      Catch::Contains("avx512bf16 is not available for f16"));
  REQUIRE_THROWS_AS(
      k::gemm_half(DType::bf16, false, false, -1, 4, 4, A.data(), 4, B.data(), 4, 0.0f, C.data(), 4),
      troupe::Error);
}

TEST_CASE("gemm_half is deterministic and gemm_half is gemm_half_with the dispatched backend",
          "[kernels][gemm_half]") {
  const int M = 200, N = 150, K = 900;
  for (DType dt : {DType::bf16, DType::f16}) {
    const auto af = random_f32(size_t(M) * K, 11), bf = random_f32(size_t(K) * N, 12);
    std::vector<uint16_t> A(af.size()), B(bf.size());
    k::to_half(dt, A.data(), af.data(), af.size());
    k::to_half(dt, B.data(), bf.data(), bf.size());
    for (const Runner& run : runners_for(dt))
      for (bool ta : {false, true}) {
        INFO("runner=" << run.name << " dtype=" << troupe::dtype_name(dt) << " ta=" << ta);
        const Case c{ta, false, M, N, K, 0.0f, false};
        std::vector<float> C1(size_t(M) * N, 1.0f), shifted(size_t(M) * N + 3, -7.0f);
        run.run(dt, c, A.data(), ta ? M : K, B.data(), N, C1.data(), N, nullptr);
        // A second call from another heap state, into a C at another alignment.
        run.run(dt, c, A.data(), ta ? M : K, B.data(), N, shifted.data() + 3, N, nullptr);
        REQUIRE(std::memcmp(C1.data(), shifted.data() + 3, sizeof(float) * C1.size()) == 0);
      }
    std::vector<float> C1(size_t(M) * N), C2(size_t(M) * N);
    k::gemm_half(dt, false, false, M, N, K, A.data(), K, B.data(), N, 0.0f, C1.data(), N);
    const auto chosen = static_cast<HalfGemmBackend>(k::gemm_dispatch(dt, false, false, M, N, K));
    CHECK(k::half_gemm_backend_available(chosen, dt));
    k::gemm_half_with(chosen, dt, false, false, M, N, K, A.data(), K, B.data(), N, 0.0f, C2.data(), N);
    REQUIRE(std::memcmp(C1.data(), C2.data(), sizeof(float) * C1.size()) == 0);
  }
}
