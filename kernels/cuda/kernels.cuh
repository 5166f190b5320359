// The CUDA kernels, one per entry of the table (kernels/kernels.hpp), each declared with the
// type of its CPU twin (kernels/cpu/kernels.hpp, whose contracts they keep); pointers are
// device pointers. Internal to kernels/cuda/: the rest of troupe reaches them through
// cuda_kernels().
#pragma once

#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/kernels.hpp"

namespace troupe::kernels::cuda {

#define TROUPE_DECLARE_TWIN(entry) decltype(::troupe::kernels::cpu::entry) entry;
TROUPE_KERNEL_ENTRIES(TROUPE_DECLARE_TWIN)
#undef TROUPE_DECLARE_TWIN

}  // namespace troupe::kernels::cuda
