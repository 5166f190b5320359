#include "worker/device.hpp"

#include <filesystem>

#include "core/error.hpp"

#ifdef TROUPE_HAVE_CUDA_KERNELS
#include "kernels/cuda/cuda.hpp"
#endif

namespace troupe::worker {

bool have_cuda_kernels() {
#ifdef TROUPE_HAVE_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

int local_gpu_count(std::string* why) {
#ifdef TROUPE_HAVE_CUDA_KERNELS
  return kernels::cuda::device_count(why);
#else
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); ++it)
    ++n;
  if (n == 0 && why != nullptr) *why = "no NVIDIA GPU in /proc/driver/nvidia/gpus";
  return n;
#endif
}

model::DeviceContext device_context(DeviceKind kind, int index, DType compute_dtype) {
  model::DeviceContext ctx = model::DeviceContext::cpu();
  ctx.compute_dtype = compute_dtype;
  if (kind == DeviceKind::cpu) return ctx;
#ifdef TROUPE_HAVE_CUDA_KERNELS
  std::string why;
  const int n = kernels::cuda::device_count(&why);
  require(index >= 0 && index < n, "resources.device: cuda: no CUDA device ", index, " in this process (", n,
          " visible", n == 0 ? ": " + why : std::string(), ")");
  kernels::cuda::set_device(index);
  kernels::cuda::install();
  ctx.device = Device::cuda;
  ctx.kernels = &kernels::cuda_kernels();
  ctx.alloc = &kernels::cuda::allocator();
  ctx.stream = kernels::cuda::current_stream();
  ctx.validate();
  return ctx;
#else
  (void)index;
  throw Error(
      "resources.device: cuda: this build has no CUDA kernels (it was configured without nvcc and NCCL; "
      "docs/gpu.md says how to build them)");
#endif
}

void use_device(DeviceKind kind, int index) {
#ifdef TROUPE_HAVE_CUDA_KERNELS
  if (kind == DeviceKind::cuda) kernels::cuda::set_device(index);
#else
  (void)kind;
  (void)index;
#endif
}

void synchronize(DeviceKind kind) {
#ifdef TROUPE_HAVE_CUDA_KERNELS
  if (kind == DeviceKind::cuda) kernels::cuda::synchronize();
#else
  (void)kind;
#endif
}

Allocator& staging_allocator(DeviceKind kind) {
#ifdef TROUPE_HAVE_CUDA_KERNELS
  if (kind == DeviceKind::cuda) return kernels::cuda::pinned_allocator();
#else
  (void)kind;
#endif
  return cpu_allocator();
}

}  // namespace troupe::worker
