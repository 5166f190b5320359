// Element types and devices: one DType for tensors (core/tensor.hpp), the data
// plane (comm/) and files (core/safetensors.hpp, checkpoint/), so a buffer's type
// means the same thing wherever it travels.
//
// bf16 and f16 have no C++ arithmetic type here: their buffers are uint16_t bit
// patterns named by the DType next to them; core/dtype_convert.hpp converts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe {

// The numeric values are stable (new types are appended): f64 came last.
enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8, f64 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType dt);
// Lower-case names used in logs and errors: "f32", "bf16", ...
const char* dtype_name(DType dt);
const char* device_name(Device d);
// f32, f64, bf16, f16.
bool is_floating(DType dt);
// A value of the enum (not a stray cast): what a boundary that receives a DType checks.
bool is_valid(DType dt);

// The DType of a C++ element type: dtype_of<float>() == DType::f32.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}

}  // namespace troupe
