// Who owns a tensor's memory. core has one allocator, the CPU one (64-byte
// aligned host memory). A device build brings its own (a CUDA allocator over
// cudaMalloc or a caching pool, say) and registers it for its Device; from then
// on Tensor::empty(shape, dtype, Device::cuda) allocates through it, and
// zero_() / copy_from() of that device's tensors go through its zero and copy.
// Nothing registers one in this build: a CUDA tensor is refused with a clear error.
#pragma once

#include <cstddef>

#include "core/dtype.hpp"

namespace troupe {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
  // At least `bytes` bytes aligned to 64 (Tensor::kAlignment); bytes may be 0 and
  // still gives a distinct pointer. Throws troupe::Error when out of memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  // On memory of this allocator's device: zero-fill, and a copy (ranges may overlap).
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Copies between host memory and this allocator's memory, finished when they return (a
  // device's waits for its stream). For the CPU they are copy().
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) { copy(dst, host_src, bytes); }
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) { copy(host_dst, src, bytes); }
  // zero() that may also hand the whole memory pages inside [p, p + bytes) back to the
  // system until they are written again (the CPU allocator: madvise MADV_DONTNEED on
  // its private pages, which read back as zeros; the partial pages at the ends are
  // zeroed in place). What ZeRO 2 does with the gradient it no longer owns.
  virtual void release(void* p, size_t bytes) { zero(p, bytes); }
};

// The process's CPU allocator (std::aligned_alloc); lives for the whole process.
Allocator& cpu_allocator();

// The allocator tensors of `device` use: the CPU one, or the one registered for a
// device; null when none is registered.
Allocator* allocator_for(Device device);

// Registers the allocator of a non-CPU device (null removes it). The allocator must
// outlive every tensor it allocated. Call it before any thread allocates on that device.
void register_allocator(Device device, Allocator* alloc);

}  // namespace troupe
