#include "core/dtype.hpp"

#include "core/error.hpp"

namespace troupe {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::f64:
      return 8;
  }
  TROUPE_CHECK(false, "unknown dtype ", static_cast<int>(dt));
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::f64:
      return "f64";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

bool is_floating(DType dt) {
  return dt == DType::f32 || dt == DType::f64 || dt == DType::bf16 || dt == DType::f16;
}

bool is_valid(DType dt) { return static_cast<unsigned>(dt) <= static_cast<unsigned>(DType::f64); }

}  // namespace troupe
