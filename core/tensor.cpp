#include "core/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <sstream>

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
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    TROUPE_CHECK(s >= 0, "negative dimension in shape ", shape_str(shape));
    n *= s;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  // CUDA allocation lives in the CUDA build; the CPU build refuses it clearly.
  TROUPE_CHECK(device == Device::cpu, "this build allocates CPU tensors only");
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  size_t bytes = t.nbytes();
  // aligned_alloc wants a multiple of the alignment; a zero-size tensor still gets a buffer.
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  TROUPE_CHECK(p != nullptr, "out of memory allocating ", bytes, " bytes");
  t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::view_of(void* data, Shape shape, DType dtype, Device device) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  TROUPE_CHECK(data != nullptr || t.numel_ == 0, "view of a null pointer");
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.data_ = data;
  return t;
}

int64_t Tensor::size(int dim) const {
  int n = ndim();
  if (dim < 0) dim += n;
  TROUPE_CHECK(dim >= 0 && dim < n, "dim ", dim, " out of range for shape ", shape_str(shape_));
  return shape_[static_cast<size_t>(dim)];
}

float* Tensor::f32() const {
  TROUPE_CHECK(dtype_ == DType::f32, "tensor is ", dtype_name(dtype_), ", not f32");
  return static_cast<float*>(data_);
}

int32_t* Tensor::i32() const {
  TROUPE_CHECK(dtype_ == DType::i32, "tensor is ", dtype_name(dtype_), ", not i32");
  return static_cast<int32_t*>(data_);
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  TROUPE_CHECK(ndim() >= 1, "slice of a 0-d tensor");
  TROUPE_CHECK(0 <= begin && begin <= end && end <= shape_[0], "slice [", begin, ", ", end,
               ") out of range for shape ", shape_str(shape_));
  int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.numel_ = row * (end - begin);
  t.data_ = static_cast<uint8_t*>(data_) + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TROUPE_CHECK(infer < 0, "reshape with more than one -1: ", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      TROUPE_CHECK(shape[i] >= 0, "bad reshape target ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    TROUPE_CHECK(known > 0 && numel_ % known == 0, "cannot reshape ", shape_str(shape_), " to ",
                 shape_str(shape));
    shape[static_cast<size_t>(infer)] = numel_ / known;
    known = numel_;
  }
  TROUPE_CHECK(known == numel_, "cannot reshape ", shape_str(shape_), " to ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

void Tensor::zero_() {
  if (numel_ > 0) std::memset(data_, 0, nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  TROUPE_CHECK(src.dtype_ == dtype_ && src.numel_ == numel_, "copy_from ", dtype_name(src.dtype_),
               shape_str(src.shape_), " into ", dtype_name(dtype_), shape_str(shape_));
  if (numel_ > 0 && src.data_ != data_) std::memmove(data_, src.data_, nbytes());
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

}  // namespace troupe
