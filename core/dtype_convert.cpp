#include "core/dtype_convert.hpp"

#include "core/error.hpp"

namespace troupe {

namespace {

// One element of a floating dtype as f32 / from f32. The f32 and f64 cases
// never come through here (convert handles them directly).
float load(DType dt, const void* p, size_t i) {
  switch (dt) {
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f64:
      return static_cast<float>(static_cast<const double*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

void store(DType dt, void* p, size_t i, float v) {
  switch (dt) {
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      return;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      return;
    case DType::f64:
      static_cast<double*>(p)[i] = v;
      return;
    default:
      static_cast<float*>(p)[i] = v;
      return;
  }
}

}  // namespace

void convert(DType from, const void* src, DType to, void* dst, size_t n) {
  TROUPE_CHECK(is_floating(from) && is_floating(to), "no conversion from ", dtype_name(from), " to ",
               dtype_name(to), ": conversions are between f32, f64, bf16 and f16");
  if (n == 0) return;
  if (from == to) {
    std::memmove(dst, src, n * dtype_size(from));
    return;
  }
  // The common cases get their own loops (the compiler vectorises them).
  if (from == DType::bf16 && to == DType::f32) {
    const auto* s = static_cast<const uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  if (from == DType::f32 && to == DType::bf16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  if (from == DType::f64 && to == DType::f32) {
    const auto* s = static_cast<const double*>(src);
    auto* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
    return;
  }
  if (from == DType::f32 && to == DType::f64) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<double*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
    return;
  }
  for (size_t i = 0; i < n; ++i) store(to, dst, i, load(from, src, i));
}

}  // namespace troupe
