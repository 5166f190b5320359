// kernels::cuda_kernels(): the functions of kernels/cuda/ as a kernels::Kernels table.
#include "kernels/cuda/cuda.hpp"
#include "kernels/cuda/kernels.cuh"

namespace troupe::kernels {

namespace {

Kernels make_cuda_table() {
  Kernels k;
  k.name = "cuda";
  k.device = Device::cuda;
#define TROUPE_SET_ENTRY(entry) k.entry = &cuda::entry;
  TROUPE_KERNEL_ENTRIES(TROUPE_SET_ENTRY)
#undef TROUPE_SET_ENTRY
  return k;
}

}  // namespace

const Kernels& cuda_kernels() {
  static const Kernels table = make_cuda_table();
  return table;
}

}  // namespace troupe::kernels
