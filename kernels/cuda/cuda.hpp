// The CUDA kernel set: a twin of every kernel of kernels/cpu/ with the same name, signature
// and contract (kernels/cpu/kernels.hpp), on device pointers, as a kernels::Kernels table
// (kernels/kernels.hpp). GEMMs (linear) go through cuBLASLt with f32 accumulation; attention
// through cuBLAS strided-batched GEMMs and a causal softmax kernel. Reductions run in a fixed
// order (no atomics on values), so the same inputs give the same bits.
//
// Built only when the build has CUDA (TROUPE_HAVE_CUDA_KERNELS), for sm_90; this header
// has no CUDA include, so that host code can name the set without the CUDA headers.
//
// Launches go to the calling thread's current stream (set_stream; the legacy default
// stream until set). Kernels that return a value to the host (cross_entropy, sum_squares)
// and those that check their input on the device (the tokens of embedding_forward and
// embedding_backward, the targets of cross_entropy) wait for the stream before returning.
// Every CUDA, cuBLAS and cuBLASLt call is checked: a failure throws troupe::Error naming
// the call, its file:line and the library's error.
#pragma once

#include <cstddef>
#include <string>

#include "core/caching_allocator.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels {

// The table: name "cuda", device Device::cuda. Lives for the whole process.
const Kernels& cuda_kernels();

namespace cuda {

// CUDA devices visible to this process; 0 without a device or a driver (never throws).
// `why`, when given, receives the reason there are none.
int device_count(std::string* why = nullptr);
void set_device(int device);

// The stream this thread launches on (a cudaStream_t; nullptr is the legacy default stream).
void set_stream(void* stream);
void* current_stream();
void synchronize();  // waits for this thread's current stream

// f32 GEMMs in TF32 (10-bit mantissa products, f32 accumulation) instead of full f32.
// Off by default; a process-wide setting.
void set_tf32(bool on);

// The device allocator: a CachingAllocator (core/caching_allocator.hpp) over cudaMalloc on
// the current device; zero and copy run on the current stream and wait for it. install()
// registers it for Device::cuda tensors (core/allocator.hpp). Its cache knows neither
// devices nor streams: a process uses one device (troupe runs a worker per device), and
// a block freed while another stream may still use it is the caller's to fence.
CachingAllocator& allocator();
void install();
// Page-locked host memory (cudaHostAlloc), for buffers copied to and from the device
// (checkpoint snapshots): a Device::cpu allocator, never registered.
Allocator& pinned_allocator();

// Synchronous copies between host and device memory.
void to_device(void* dst, const void* src, size_t bytes);
void to_host(void* dst, const void* src, size_t bytes);

}  // namespace cuda

}  // namespace troupe::kernels
