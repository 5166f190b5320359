// Small building blocks shared by the CPU kernels (internal, not part of the API).
//
// Two goals pull together here: speed without -ffast-math, and bit-for-bit
// determinism. Reductions keep kLanes independent partial sums that are combined
// in a fixed order at the end: the compiler may then vectorize them (each lane is
// its own chain, so no reassociation is needed) and the result does not depend on
// the vector width the compiler picked. exp_approx replaces std::exp, which glibc
// does not vectorize without -ffast-math, with a polynomial of our own; its
// result is the same on every machine and libm version.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

// The project builds for baseline x86-64 (SSE2). Hot loops are also compiled for AVX2 and
// AVX-512 and the best is picked at load time (ifunc). The clones give the same bits: the
// lane reductions fix the summation order, and the build keeps -ffp-contract=off, so no clone
// fuses a multiply and an add that another does not. -DTROUPE_VEC_CLONES= turns them off.
#ifndef TROUPE_VEC_CLONES
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TROUPE_VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TROUPE_VEC_CLONES
#endif
#endif

namespace troupe::kernels::cpu::detail {

constexpr int kLanes = 16;

// Sum of x(n); lanes combined pairwise in a fixed order.
inline float lane_sum(const float* __restrict__ x, size_t n) {
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  for (size_t j = 0; j < n - i && j < kLanes; ++j) acc[j] += x[i + j];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

// Dot product of x(n) and y(n), same lane scheme as lane_sum.
inline float lane_dot(const float* __restrict__ x, const float* __restrict__ y, size_t n) {
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * y[i + j];
  for (size_t j = 0; j < n - i && j < kLanes; ++j) acc[j] += x[i + j] * y[i + j];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

// sum of x*y*z over (n), same lane scheme as lane_sum.
inline float lane_dot3(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ z,
                       size_t n) {
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * y[i + j] * z[i + j];
  for (size_t j = 0; j < n - i && j < kLanes; ++j) acc[j] += x[i + j] * y[i + j] * z[i + j];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

// Maximum of x(n), n >= 1.
inline float lane_max(const float* __restrict__ x, size_t n) {
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = x[0];
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  for (size_t j = 0; j < n - i && j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] = acc[j + w] > acc[j] ? acc[j + w] : acc[j];
  return acc[0];
}

// e^x in float, about 1 ulp; 0 below about -87.68 (where e^x < 1.1e-38), finite (e^88.3) above.
// x = n*ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2 so r is exact), e^r by its degree-7
// Taylor polynomial (truncation < 1e-8 relative), 2^n built in the exponent bits; n = -127
// gives the bit pattern of +0, which is how underflow reaches 0 without a branch. Branch-free
// so that loops calling it vectorize.
inline float exp_approx(float x) {
  x = x > 88.3f ? 88.3f : x;
  x = x < -88.0f ? -88.0f : x;
  // Adding and subtracting 1.5*2^23 rounds to the nearest integer (default rounding mode).
  const float magic = 12582912.0f;
  const float n = (x * 1.44269504088896341f + magic) - magic;  // in [-127, 127]
  float r = x - n * 0.693145751953125f;                        // ln2 high part: n*hi is exact
  r = r - n * 1.428606765330187e-06f;                          // ln2 low part
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// sum of e^(x - mx) over x(n), same lane scheme as lane_sum (softmax denominators).
inline float lane_sum_exp(const float* __restrict__ x, size_t n, float mx) {
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += exp_approx(x[i + j] - mx);
  for (size_t j = 0; j < n - i && j < kLanes; ++j) acc[j] += exp_approx(x[i + j] - mx);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

// tanh(u) = 1 - 2 / (e^(2u) + 1): exactly +-1 once |u| > ~9 (e^(2u) saturates at e^88.3 or 0).
inline float tanh_approx(float u) { return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f); }

}  // namespace troupe::kernels::cpu::detail
