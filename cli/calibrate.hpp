// `troupe plan --calibrate`: measures this machine and writes a cpu hardware profile
// (plan/hardware.hpp) that plans on `cpu` devices then use by default.
#pragma once

#include <string>
#include <vector>

namespace troupe::cli {

// specs: job specs whose shapes are measured (none = a generic grid of GEMM shapes);
// devices: worker processes to measure side by side (0 = one per core); out: the file to
// write ("" = <hardware_dir()>/cpu.yaml). Returns the exit code.
int run_calibrate(const std::vector<std::string>& specs, int devices, const std::string& out);

}  // namespace troupe::cli
