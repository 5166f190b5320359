#include "core/tensor.hpp"

#include <cstring>
#include <sstream>

#include "core/allocator.hpp"
#include "core/error.hpp"

namespace troupe {

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
  Allocator* alloc = allocator_for(device);
  // A device allocator is the device build's to register; without one, refuse clearly.
  TROUPE_CHECK(alloc != nullptr, "no allocator is registered for ", device_name(device),
               " tensors: this build allocates CPU tensors only");
  return empty(std::move(shape), dtype, *alloc);
}

Tensor Tensor::empty(Shape shape, DType dtype, Allocator& alloc) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = alloc.device();
  void* p = alloc.allocate(t.nbytes());
  Allocator* a = &alloc;
  t.storage_ = std::shared_ptr<void>(p, [a](void* q) { a->deallocate(q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Allocator& alloc) {
  Tensor t = empty(std::move(shape), dtype, alloc);
  alloc.zero(t.data_, t.nbytes());
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

uint16_t* Tensor::h16() const {
  TROUPE_CHECK(dtype_ == DType::bf16 || dtype_ == DType::f16, "tensor is ", dtype_name(dtype_),
               ", not bf16 or f16");
  return static_cast<uint16_t*>(data_);
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

namespace {

Allocator& device_allocator(Device d) {
  Allocator* a = allocator_for(d);
  TROUPE_CHECK(a != nullptr, "no allocator is registered for ", device_name(d), " tensors");
  return *a;
}

}  // namespace

void Tensor::zero_() {
  if (numel_ == 0) return;
  if (device_ == Device::cpu)
    std::memset(data_, 0, nbytes());
  else
    device_allocator(device_).zero(data_, nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  TROUPE_CHECK(src.dtype_ == dtype_ && src.numel_ == numel_, "copy_from ", dtype_name(src.dtype_),
               shape_str(src.shape_), " into ", dtype_name(dtype_), shape_str(shape_));
  TROUPE_CHECK(src.device_ == device_, "copy_from a ", device_name(src.device_), " tensor into a ",
               device_name(device_), " one: copies between devices are the device build's");
  if (numel_ == 0 || src.data_ == data_) return;
  if (device_ == Device::cpu)
    std::memmove(data_, src.data_, nbytes());
  else
    device_allocator(device_).copy(data_, src.data_, nbytes());
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

}  // namespace troupe
