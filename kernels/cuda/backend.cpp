// The entry point of the CUDA backend (kernels/cuda_backend.hpp): the table of what
// kernels/cuda/cuda.hpp and comm/nccl/nccl_comm.hpp define, for libtroupe_cuda.so and for
// the binaries that link the backend in.
#include "comm/nccl/nccl_comm.hpp"
#include "kernels/cuda/cuda.hpp"
#include "kernels/cuda_backend.hpp"

extern "C" __attribute__((visibility("default"))) const troupe::kernels::CudaBackend*
troupe_cuda_backend_v1() {
  namespace k = troupe::kernels;
  static const k::CudaBackend backend = [] {
    k::CudaBackend b;
    b.abi = k::kCudaBackendAbi;
    b.size = sizeof(k::CudaBackend);
    b.kernels = &k::cuda_kernels;
    b.device_count = &k::cuda::device_count;
    b.set_device = &k::cuda::set_device;
    b.current_stream = &k::cuda::current_stream;
    b.synchronize = &k::cuda::synchronize;
    b.allocator = &k::cuda::allocator;
    b.install = &k::cuda::install;
    b.pinned_allocator = &k::cuda::pinned_allocator;
    b.make_nccl_communicator = &troupe::comm::make_nccl_communicator;
    return b;
  }();
  return &backend;
}
