#include "comm/reduce.hpp"

#include <algorithm>
#include <cstdint>

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
  }
}

}  // namespace troupe::comm
