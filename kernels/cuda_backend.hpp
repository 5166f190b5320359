// The CUDA backend of a process: every part of troupe that needs the CUDA runtime (the CUDA
// kernel set, kernels/cuda/cuda.hpp, and the NCCL communicator, comm/nccl/nccl_comm.hpp) as
// one table, so that a process that never touches a GPU never loads the CUDA libraries.
//
// Loading libcudart, libcublas, libcublasLt and libnccl at start cost every process of a
// CUDA build (the coordinator, each agent, every CPU worker, each `troupe` command) about
// 0.4 s and 200 MiB of memory. The `troupe` executable therefore does not link them: the
// first call of cuda_backend() loads libtroupe_cuda.so (built next to the executable,
// TROUPE_CUDA_LIBRARY to name another) with dlopen, and the library finds the rest of troupe
// in the executable, which exports its symbols. Binaries that link the backend in (the CUDA
// tests and benchmarks, through the troupe_cuda library) use their own copy and load nothing.
//
// Host code only: no CUDA header is included here.
#pragma once

#include <memory>
#include <string>

#include "core/caching_allocator.hpp"
#include "kernels/kernels.hpp"

namespace troupe::comm {
class Communicator;
struct CommConfig;
}  // namespace troupe::comm

namespace troupe::kernels {

// Raised by hand when the table changes: a library from another build is refused.
constexpr int kCudaBackendAbi = 1;

struct CudaBackend {
  int abi = 0;
  size_t size = 0;  // sizeof(CudaBackend) where the library was built

  // kernels/cuda/cuda.hpp, entry for entry.
  const Kernels& (*kernels)() = nullptr;
  int (*device_count)(std::string* why) = nullptr;
  void (*set_device)(int device) = nullptr;
  void* (*current_stream)() = nullptr;
  void (*synchronize)() = nullptr;
  CachingAllocator& (*allocator)() = nullptr;
  void (*install)() = nullptr;
  Allocator& (*pinned_allocator)() = nullptr;

  // comm/nccl/nccl_comm.hpp: a new NCCL communicator, owned by the caller.
  std::unique_ptr<comm::Communicator> (*make_nccl_communicator)(const comm::CommConfig& cfg) = nullptr;
};

// The backend, loaded on the first call; null in a build without CUDA, or when the library
// cannot be loaded (its path and the loader's reason in `why`). Thread-safe; never throws.
const CudaBackend* cuda_backend(std::string* why = nullptr);

// Whether this build has a CUDA backend at all (loaded or not).
bool cuda_built();

}  // namespace troupe::kernels

// The library's one entry point is `extern "C" const CudaBackend* troupe_cuda_backend_v1()`
// (kernels/cuda/backend.cpp).
