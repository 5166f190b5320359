#include "model/device_context.hpp"

#include "core/error.hpp"

namespace troupe::model {

DeviceContext DeviceContext::cpu() {
  DeviceContext c;
  c.device = Device::cpu;
  c.kernels = &kernels::cpu_kernels();
  c.alloc = &cpu_allocator();
  c.stream = nullptr;
  c.compute_dtype = DType::f32;
  return c;
}

void DeviceContext::validate() const {
  TROUPE_CHECK(kernels != nullptr && alloc != nullptr, "device context for ", device_name(device),
               " lacks its kernels or its allocator");
  TROUPE_CHECK(kernels->device == device, "device context for ", device_name(device), " has the '",
               kernels->name, "' kernels of ", device_name(kernels->device));
  TROUPE_CHECK(alloc->device() == device, "device context for ", device_name(device), " has the '",
               alloc->name(), "' allocator of ", device_name(alloc->device()));
  TROUPE_CHECK(compute_dtype == DType::f32 || compute_dtype == DType::bf16 || compute_dtype == DType::f16,
               "compute dtype ", dtype_name(compute_dtype), ": weights compute in f32, bf16 or f16");
}

}  // namespace troupe::model
