// The device a rank trains on: the model::DeviceContext of a job's resources.device, and
// the GPUs this host has.
//
// cpu: DeviceContext::cpu(). cuda (a build with the CUDA kernels, kernels/cuda/): CUDA
// device `index` becomes this process's device, its caching allocator is registered for
// Device::cuda tensors, and the context holds the CUDA kernel table and that allocator.
// A build without them, or a host without that GPU, is refused with the reason.
#pragma once

#include <string>

#include "core/spec.hpp"
#include "model/device_context.hpp"

namespace troupe::worker {

model::DeviceContext device_context(DeviceKind kind, int index, DType compute_dtype);
// Makes CUDA device `index` the calling thread's (the device is a per-thread setting of the
// CUDA runtime): for a thread other than the one that made the context. Nothing for cpu.
void use_device(DeviceKind kind, int index);
// Waits for the work queued on the calling thread's stream (cuda); nothing for cpu.
void synchronize(DeviceKind kind);

// Whether this build has the CUDA kernels.
bool have_cuda_kernels();

// The GPUs this process can use: the CUDA runtime's count in a build with the CUDA kernels
// (which honours CUDA_VISIBLE_DEVICES), else the driver's /proc/driver/nvidia/gpus entries.
// 0 when there are none; `why` then says why.
int local_gpu_count(std::string* why = nullptr);

// Pinned host memory for device -> host snapshot copies (a CUDA build), else the CPU allocator.
Allocator& staging_allocator(DeviceKind kind);

}  // namespace troupe::worker
