// Conversions between the floating dtypes, in one place (tensors, checkpoints,
// the 16-bit reductions of comm/ and the compute copy of model/params.hpp all
// round the same way).
//
//   bf16  the top 16 bits of an f32 (8-bit exponent, 7-bit mantissa).
//   f16   IEEE binary16 (5-bit exponent, 10-bit mantissa, subnormals).
//
// Narrowing (f32 -> bf16 / f16) rounds to nearest, ties to even; values beyond
// the largest finite one round to +-inf as IEEE rounding does; a NaN stays a NaN
// (quiet, sign and the top payload bits kept), never turning into inf. Widening
// (bf16 / f16 -> f32) is exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"

namespace troupe {

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t{h} << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  // NaN: truncating could clear every mantissa bit left (= inf); set the quiet bit.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Round to nearest even on the 16 bits dropped: add just under half, plus the
  // kept lowest bit (a tie then rounds up only from an odd mantissa). A carry
  // into the exponent is the correct rounding, up to inf.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_to_f32(sign | 0x7f800000u | (m << 13));  // inf, NaN (payload kept)
  if (e != 0) return bits_to_f32(sign | ((e + 112) << 23) | (m << 13));
  if (m == 0) return bits_to_f32(sign);
  // Subnormal m * 2^-24: normalise into an f32 exponent.
  e = 113;
  while ((m & 0x400u) == 0) {
    m <<= 1;
    --e;
  }
  return bits_to_f32(sign | (e << 23) | ((m & 0x3ffu) << 13));
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN, quiet
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  uint32_t keep, rest, half;
  if (a >= 0x38800000u) {  // >= 2^-14: normal; rebias the exponent, drop 13 mantissa bits
    keep = (a - 0x38000000u) >> 13;
    rest = a & 0x1fffu;
    half = 0x1000u;
  } else {                                                    // subnormal (units of 2^-24) or zero
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to 0
    const uint32_t shift = 126 - (a >> 23);                   // 14..24
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    keep = m >> shift;
    rest = m & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  }
  // A carry out of the mantissa lands in the exponent: the correct next value.
  if (rest > half || (rest == half && (keep & 1u))) ++keep;
  return static_cast<uint16_t>(sign | keep);
}

// dst(n) of dtype `to` <- src(n) of dtype `from`, for floating dtypes (f32, f64,
// bf16, f16); from == to copies. f64 narrows to f32 with the C++ conversion
// (round to nearest even); f64 <-> bf16 / f16 passes through f32 (f64 -> 16 bits
// can thus round twice). src and dst must not overlap unless from == to.
// Throws troupe::Error naming the dtypes for anything else.
void convert(DType from, const void* src, DType to, void* dst, size_t n);

}  // namespace troupe
