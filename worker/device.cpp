#include "worker/device.hpp"

#include <filesystem>

#include "core/error.hpp"
#include "kernels/cuda_backend.hpp"

namespace troupe::worker {

namespace {

// GPUs the NVIDIA driver lists in /proc: no library loaded to know that there are none.
int driver_gpu_count() {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); ++it)
    ++n;
  return n;
}

// Whether this host may have an NVIDIA GPU that /proc does not list (a container's device
// nodes, WSL's /dev/dxg): then only the CUDA runtime can say.
bool gpu_device_nodes() {
  std::error_code ec;
  return std::filesystem::exists("/dev/nvidiactl", ec) || std::filesystem::exists("/dev/dxg", ec);
}

// The backend a resources.device: cuda job runs on; throws with the reason there is none.
const kernels::CudaBackend& backend() {
  std::string why;
  const kernels::CudaBackend* b = kernels::cuda_backend(&why);
  if (b == nullptr) throw Error("resources.device: cuda: " + why);
  return *b;
}

}  // namespace

bool have_cuda_kernels() { return kernels::cuda_built(); }

int local_gpu_count(std::string* why) {
  // Without the CUDA backend the driver's list is the answer; with it, the CUDA runtime is,
  // unless there is no sign of an NVIDIA GPU at all: the CUDA libraries are not loaded to
  // say that there is none.
  const int in_driver = driver_gpu_count();
  if (!kernels::cuda_built() || (in_driver == 0 && !gpu_device_nodes())) {
    if (in_driver == 0 && why != nullptr)
      *why = kernels::cuda_built()
                 ? "no NVIDIA GPU here (none in /proc/driver/nvidia/gpus, no /dev/nvidiactl)"
                 : "no NVIDIA GPU in /proc/driver/nvidia/gpus";
    return in_driver;
  }
  std::string load_why;
  const kernels::CudaBackend* b = kernels::cuda_backend(&load_why);
  if (b == nullptr) {
    if (why != nullptr) *why = load_why;
    return 0;
  }
  return b->device_count(why);
}

model::DeviceContext device_context(DeviceKind kind, int index, DType compute_dtype) {
  model::DeviceContext ctx = model::DeviceContext::cpu();
  ctx.compute_dtype = compute_dtype;
  if (kind == DeviceKind::cpu) return ctx;
  if (!kernels::cuda_built())
    throw Error(
        "resources.device: cuda: this build has no CUDA kernels (it was configured without nvcc and NCCL; "
        "docs/gpu.md says how to build them)");
  const kernels::CudaBackend& cuda = backend();
  std::string why;
  const int n = cuda.device_count(&why);
  require(index >= 0 && index < n, "resources.device: cuda: no CUDA device ", index, " in this process (", n,
          " visible", n == 0 ? ": " + why : std::string(), ")");
  cuda.set_device(index);
  cuda.install();
  ctx.device = Device::cuda;
  ctx.kernels = &cuda.kernels();
  ctx.alloc = &cuda.allocator();
  ctx.stream = cuda.current_stream();
  ctx.validate();
  return ctx;
}

void use_device(DeviceKind kind, int index) {
  if (kind == DeviceKind::cuda) backend().set_device(index);
}

void synchronize(DeviceKind kind) {
  if (kind == DeviceKind::cuda) backend().synchronize();
}

Allocator& staging_allocator(DeviceKind kind) {
  if (kind == DeviceKind::cuda) return backend().pinned_allocator();
  return cpu_allocator();
}

}  // namespace troupe::worker
