// Where and in what precision a stage computes: the device, the kernel table it
// calls (kernels/kernels.hpp), the allocator its activations come from
// (core/allocator.hpp), the stream its work is queued on, and the compute dtype
// of its weights (model/params.hpp: Param::compute).
//
// DeviceContext::cpu() is the CPU one: the CPU kernels, the CPU allocator, no
// stream, f32; with compute_dtype bf16 or f16 it trains in mixed precision (the
// CPU table has the 16-bit linear kernels). A CUDA build would pass its own (CUDA
// kernels, a device allocator, its cudaStream_t); none exists yet, and Stage
// refuses a context it cannot run (see Stage's constructor).
#pragma once

#include "core/allocator.hpp"
#include "core/dtype.hpp"
#include "kernels/kernels.hpp"

namespace troupe::model {

struct DeviceContext {
  Device device = Device::cpu;
  const kernels::Kernels* kernels = nullptr;  // not owned; outlives the stage
  Allocator* alloc = nullptr;                 // not owned; outlives the stage
  void* stream = nullptr;                     // CUDA: the cudaStream_t to queue on; CPU: null
  DType compute_dtype = DType::f32;

  static DeviceContext cpu();
  // Throws troupe::Error unless kernels and alloc are set and all name `device`,
  // and compute_dtype is f32, bf16 or f16.
  void validate() const;
};

}  // namespace troupe::model
