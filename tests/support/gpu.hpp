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

}  // namespace troupe::testing
