// A stand-in second device for the device branches of host code: host memory under
// Device::cuda that counts the copies into and out of it, registered for Device::cuda while it
// lives, with the CPU kernel table relabelled for that device (kernels()). Code that computes on
// it must give the CPU's bits, with every input reaching it through copy_from_host and every
// read going through copy_to_host. What it checks is that logic (uploads, staging, copies), not a
// GPU: the CUDA kernels and the engine on a real GPU are tests/kernels/test_cuda_kernels.cpp's and
// tests/engine/test_engine_cuda.cpp's. One at a time per process.
#pragma once

#include <cstring>

#include "core/allocator.hpp"
#include "kernels/kernels.hpp"

namespace troupe::testing {

class HostBackedDevice final : public Allocator {
 public:
  HostBackedDevice() : table_(kernels::cpu_kernels()) {
    table_.name = "cpu-as-device";
    table_.device = Device::cuda;
    register_allocator(Device::cuda, this);
  }
  ~HostBackedDevice() override { register_allocator(Device::cuda, nullptr); }
  HostBackedDevice(const HostBackedDevice&) = delete;
  HostBackedDevice& operator=(const HostBackedDevice&) = delete;

  const kernels::Kernels& kernels() const { return table_; }

  Device device() const override { return Device::cuda; }
  const char* name() const override { return "host-backed"; }
  void* allocate(size_t n) override { return cpu_allocator().allocate(n); }
  void deallocate(void* p) noexcept override { cpu_allocator().deallocate(p); }
  void zero(void* p, size_t n) override { cpu_allocator().zero(p, n); }
  void copy(void* d, const void* s, size_t n) override { cpu_allocator().copy(d, s, n); }
  void copy_from_host(void* d, const void* s, size_t n) override {
    ++ins;
    std::memcpy(d, s, n);
  }
  void copy_to_host(void* d, const void* s, size_t n) override {
    ++outs;
    std::memcpy(d, s, n);
  }
  int ins = 0, outs = 0;

 private:
  kernels::Kernels table_;
};

}  // namespace troupe::testing
