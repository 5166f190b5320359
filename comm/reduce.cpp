#include "comm/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/dtype_convert.hpp"

namespace troupe::comm {

namespace {

template <class T>
void reduce_typed(ReduceOp op, T* out, const T* a, const T* b, size_t n) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      break;
    case ReduceOp::max:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      break;
    case ReduceOp::min:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      break;
  }
}

template <class T>
void divide_typed(T* data, size_t n, int divisor) {
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) data[i] /= d;
}

// A 16-bit float format: its widening and narrowing (core/dtype_convert.hpp).
struct Bf16 {
  static float widen(uint16_t h) { return bf16_to_f32(h); }
  static uint16_t narrow(float f) { return f32_to_bf16(f); }
};
struct F16 {
  static float widen(uint16_t h) { return f16_to_f32(h); }
  static uint16_t narrow(float f) { return f32_to_f16(f); }
};

float combine(ReduceOp op, float x, float y) {
  switch (op) {
    case ReduceOp::max:
      return std::max(x, y);
    case ReduceOp::min:
      return std::min(x, y);
    default:
      return x + y;
  }
}

template <class H>
void reduce_half(ReduceOp op, uint16_t* out, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = H::narrow(combine(op, H::widen(a[i]), H::widen(b[i])));
}

template <class H>
void divide_half(uint16_t* data, size_t n, int divisor) {
  const float d = static_cast<float>(divisor);
  for (size_t i = 0; i < n; ++i) data[i] = H::narrow(H::widen(data[i]) / d);
}

// reduce_all for a 16-bit format: blocks of f32 accumulators on the stack, one
// rounding per element at the end.
template <class H>
void reduce_all_half(ReduceOp op, uint16_t* out, const std::vector<const void*>& ins, size_t n) {
  constexpr size_t kBlock = 1024;
  float acc[kBlock];
  for (size_t lo = 0; lo < n; lo += kBlock) {
    const size_t m = std::min(kBlock, n - lo);
    const auto* first = static_cast<const uint16_t*>(ins[0]) + lo;
    for (size_t i = 0; i < m; ++i) acc[i] = H::widen(first[i]);
    for (size_t j = 1; j < ins.size(); ++j) {
      const auto* in = static_cast<const uint16_t*>(ins[j]) + lo;
      for (size_t i = 0; i < m; ++i) acc[i] = combine(op, acc[i], H::widen(in[i]));
    }
    if (op == ReduceOp::avg) {
      const float d = static_cast<float>(ins.size());
      for (size_t i = 0; i < m; ++i) acc[i] /= d;
    }
    for (size_t i = 0; i < m; ++i) out[lo + i] = H::narrow(acc[i]);
  }
}

}  // namespace

void reduce_into(DType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DType::f32:
      return reduce_typed(op, static_cast<float*>(out), static_cast<const float*>(a),
                          static_cast<const float*>(b), n);
    case DType::f64:
      return reduce_typed(op, static_cast<double*>(out), static_cast<const double*>(a),
                          static_cast<const double*>(b), n);
    case DType::i32:
      return reduce_typed(op, static_cast<int32_t*>(out), static_cast<const int32_t*>(a),
                          static_cast<const int32_t*>(b), n);
    case DType::i64:
      return reduce_typed(op, static_cast<int64_t*>(out), static_cast<const int64_t*>(a),
                          static_cast<const int64_t*>(b), n);
    case DType::bf16:
      return reduce_half<Bf16>(op, static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
                               static_cast<const uint16_t*>(b), n);
    case DType::f16:
      return reduce_half<F16>(op, static_cast<uint16_t*>(out), static_cast<const uint16_t*>(a),
                              static_cast<const uint16_t*>(b), n);
    case DType::u8:
      break;  // refused before it gets here (Communicator::can_reduce)
  }
}

void divide_by(DType dtype, void* data, size_t n, int divisor) {
  switch (dtype) {
    case DType::f32:
      return divide_typed(static_cast<float*>(data), n, divisor);
    case DType::f64:
      return divide_typed(static_cast<double*>(data), n, divisor);
    case DType::i32:
      return divide_typed(static_cast<int32_t*>(data), n, divisor);
    case DType::i64:
      return divide_typed(static_cast<int64_t*>(data), n, divisor);
    case DType::bf16:
      return divide_half<Bf16>(static_cast<uint16_t*>(data), n, divisor);
    case DType::f16:
      return divide_half<F16>(static_cast<uint16_t*>(data), n, divisor);
    case DType::u8:
      break;
  }
}

void reduce_all(DType dtype, ReduceOp op, void* out, const std::vector<const void*>& ins, size_t n) {
  if (ins.empty() || n == 0) return;
  if (dtype == DType::bf16) return reduce_all_half<Bf16>(op, static_cast<uint16_t*>(out), ins, n);
  if (dtype == DType::f16) return reduce_all_half<F16>(op, static_cast<uint16_t*>(out), ins, n);
  if (out != ins[0]) std::memcpy(out, ins[0], n * dtype_size(dtype));
  for (size_t j = 1; j < ins.size(); ++j) reduce_into(dtype, op, out, out, ins[j], n);
  if (op == ReduceOp::avg) divide_by(dtype, out, n, static_cast<int>(ins.size()));
}

}  // namespace troupe::comm
