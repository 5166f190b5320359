#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.hpp"
#include "cli/version.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"

namespace troupe::cli {

namespace {
// The 16-bit GEMM path for dt, or why there is none (a bad TROUPE_GEMM_HALF).
std::string half_name(DType dt) {
  try {
    return kernels::cpu::half_gemm_backend_name(kernels::cpu::half_gemm_default_backend(dt));
  } catch (const std::exception& e) {
    return std::string("unavailable: ") + e.what();
  }
}
}  // namespace

void add_version_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("version", "Print the version and what this build supports");
  cmd->callback([exit_code] {
    std::cout << "troupe " << kVersion << "\n"
              << "  cuda/nccl: " << (kHaveCuda ? "built" : "not built") << "\n"
              << "  cpu gemm:  " << kernels::cpu::gemm_backend() << "\n"
              << "  bf16 gemm: " << half_name(DType::bf16) << "\n"
              << "  fp16 gemm: " << half_name(DType::f16) << "\n"
              << "  precisions: fp32, bf16, fp16\n";
    *exit_code = kOk;
  });
}

}  // namespace troupe::cli
