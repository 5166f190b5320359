#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.hpp"
#include "cli/version.hpp"
#include "kernels/cpu/kernels.hpp"

namespace troupe::cli {

void add_version_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("version", "Print the version and what this build supports");
  cmd->callback([exit_code] {
    std::cout << "troupe " << kVersion << "\n"
              << "  cuda/nccl: " << (kHaveCuda ? "built" : "not built") << "\n"
              << "  cpu gemm:  " << kernels::cpu::gemm_backend() << "\n";
    *exit_code = kOk;
  });
}

}  // namespace troupe::cli
