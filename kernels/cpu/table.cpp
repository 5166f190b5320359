// kernels::cpu_kernels(): the CPU functions of kernels/cpu/kernels.hpp (fp32, and the
// 16-bit linear of mixed precision) as a kernels::Kernels table.
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels {

namespace {

Kernels make_cpu_table() {
  Kernels k;
  k.name = "cpu";
  k.device = Device::cpu;
#define TROUPE_SET_ENTRY(entry) k.entry = &cpu::entry;
  TROUPE_KERNEL_ENTRIES(TROUPE_SET_ENTRY)
#undef TROUPE_SET_ENTRY
  return k;
}

}  // namespace

const Kernels& cpu_kernels() {
  static const Kernels table = make_cpu_table();
  return table;
}

}  // namespace troupe::kernels
