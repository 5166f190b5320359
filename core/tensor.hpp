// Tensor: a shape, a dtype, a device and a buffer. No autograd: layers keep
// their own activations and gradients (model/).
//
// A Tensor is a handle. Copies share the buffer (like a torch.Tensor);
// clone() makes a deep copy. A tensor either owns a 64-byte-aligned
// allocation (shared by its views, which keep it alive) or is a non-owning
// view of memory someone else manages (Tensor::view_of), which must outlive it.
// Tensors are always contiguous, row-major.
//
// Memory comes from an Allocator (core/allocator.hpp): the CPU one unless the
// device's or an explicit one is given. Element access through f32() / data()
// is host access: only CPU tensors may be read that way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace troupe {

class Allocator;

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[3, 4]"

class Tensor {
 public:
  static constexpr size_t kAlignment = 64;

  Tensor() = default;  // undefined: numel() == 0, data() == nullptr

  // Owning, uninitialised / zero-filled allocations from the device's allocator
  // (allocator_for(device)); a device without one registered is refused.
  static Tensor empty(Shape shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor zeros(Shape shape, DType dtype = DType::f32, Device device = Device::cpu);
  // The same from `alloc`, which must outlive the tensor; device() is alloc.device().
  static Tensor empty(Shape shape, DType dtype, Allocator& alloc);
  static Tensor zeros(Shape shape, DType dtype, Allocator& alloc);
  // Non-owning view of `data`; the caller keeps the memory alive.
  static Tensor view_of(void* data, Shape shape, DType dtype = DType::f32, Device device = Device::cpu);

  bool defined() const { return data_ != nullptr || !shape_.empty(); }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  // True when this tensor (or the tensor it views) owns its allocation.
  bool owns_storage() const { return storage_ != nullptr; }

  void* data() const { return data_; }
  // Typed access; checks the dtype.
  float* f32() const;
  int32_t* i32() const;
  // The bit patterns of a bf16 or f16 tensor (core/dtype_convert.hpp converts them).
  uint16_t* h16() const;
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }

  // View of rows [begin, end) along dim 0 (shares the buffer).
  Tensor slice(int64_t begin, int64_t end) const;
  // View with a new shape of the same numel; one dim may be -1 (inferred).
  Tensor reshape(Shape shape) const;

  // On a non-CPU tensor these two go through its device's registered allocator.
  void zero_();
  // Byte copy from a tensor of the same dtype, numel and device (shapes may differ).
  void copy_from(const Tensor& src);
  Tensor clone() const;

 private:
  std::shared_ptr<void> storage_;  // null for non-owning views
  void* data_ = nullptr;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

}  // namespace troupe
