// The [gpu] tests' gate: whether a CUDA device is visible to this process. Without one a
// test warns "GPU test skipped" and passes, which ctest reports as skipped (SKIP_REGEX);
// where TROUPE_REQUIRE_GPU is set (scripts/gpu-check.sh run sets it) it fails instead.
// For test executables that link troupe_kernels_cuda.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda.hpp"

namespace troupe::testing {

inline bool have_gpu() {
  std::string why;
  if (kernels::cuda::device_count(&why) > 0) return true;
  if (std::getenv("TROUPE_REQUIRE_GPU") != nullptr) FAIL("no CUDA device visible (" << why << ")");
  WARN("no CUDA device visible (" << why << "): GPU test skipped");
  return false;
}

// At least n GPUs: without any, as have_gpu(); with fewer than n, a warning and a skip even
// where TROUPE_REQUIRE_GPU is set (a one-GPU machine cannot run a two-GPU job).
inline bool have_gpus(int n) {
  if (!have_gpu()) return false;
  const int count = kernels::cuda::device_count();
  if (count >= n) return true;
  WARN("needs " << n << " GPUs, " << count << " visible: GPU test skipped");
  return false;
}

}  // namespace troupe::testing
