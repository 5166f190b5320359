#include "kernels/cuda_backend.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

// Defined where the backend is linked in (the troupe_cuda library); null otherwise.
extern "C" const troupe::kernels::CudaBackend* troupe_cuda_backend_v1() __attribute__((weak));

namespace troupe::kernels {

namespace {

struct Loaded {
  const CudaBackend* backend = nullptr;
  std::string why;
};

#ifdef TROUPE_BUILD_HAS_CUDA
// `name` in the directory of this process's executable.
std::string next_to_executable(const char* name) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return name;
  std::string exe(buf, static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/') + 1) + name;
}
#endif

Loaded load() {
#ifndef TROUPE_BUILD_HAS_CUDA
  return {nullptr,
          "this build has no CUDA backend (it was configured without nvcc and NCCL; docs/gpu.md says how to "
          "build it)"};
#else
  using Entry = const CudaBackend* (*)();
  Entry entry = &troupe_cuda_backend_v1;
  std::string where = "the CUDA backend linked into this program";
  if (entry == nullptr) {
    const char* named = std::getenv("TROUPE_CUDA_LIBRARY");
    where = named != nullptr && *named != '\0' ? named : next_to_executable("libtroupe_cuda.so");
    // Local: the library's symbols stay its own; it finds troupe's in the executable.
    void* lib = ::dlopen(where.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* err = ::dlerror();
      return {nullptr, "cannot load the CUDA backend " + where + ": " +
                           (err != nullptr ? err : "dlopen failed") +
                           " (it is built next to the troupe executable; TROUPE_CUDA_LIBRARY names another)"};
    }
    entry = reinterpret_cast<Entry>(::dlsym(lib, "troupe_cuda_backend_v1"));
    if (entry == nullptr)
      return {nullptr, where + " is not a troupe CUDA backend (no troupe_cuda_backend_v1)"};
  }
  const CudaBackend* b = entry();
  if (b == nullptr || b->abi != kCudaBackendAbi || b->size != sizeof(CudaBackend))
    return {nullptr, where + " was built with another version of troupe: rebuild it with this one"};
  return {b, std::string()};
#endif
}

}  // namespace

const CudaBackend* cuda_backend(std::string* why) {
  static const Loaded loaded = load();
  if (loaded.backend == nullptr && why != nullptr) *why = loaded.why;
  return loaded.backend;
}

bool cuda_built() {
#ifdef TROUPE_BUILD_HAS_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace troupe::kernels
