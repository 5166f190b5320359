#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "cli/version.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_dispatch.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cuda_backend.hpp"

namespace troupe::cli {

namespace {

namespace kc = kernels::cpu;

// What `version --bench` times: the products of a GPT training step (config B of
// bench/train_throughput: 2048 rows, d_model 512, MLP 2048), forward and both backward.
struct BenchShape {
  const char* what;
  bool ta, tb;
  int M, N, K;
};
constexpr BenchShape kBenchShapes[] = {
    {"fwd qkv x.W^T", false, true, 2048, 1536, 512},  {"fwd fc  x.W^T", false, true, 2048, 2048, 512},
    {"fwd fc2 x.W^T", false, true, 2048, 512, 2048},  {"bwd dX  dy.W", false, false, 2048, 512, 2048},
    {"bwd dX  dy.W", false, false, 2048, 2048, 512},  {"bwd dW  dy^T.x", true, false, 2048, 512, 2048},
    {"bwd dW  dy^T.x", true, false, 1536, 512, 2048},
};

// Times every backend on every shape, for each dtype, and prints which wins.
void print_bench() {
  // The products the convert backend runs are dispatched (and logged) themselves: the table is
  // the output here.
  if (spdlog::get_level() < spdlog::level::warn) spdlog::set_level(spdlog::level::warn);
  std::printf("\nGEMM backends on this core (one thread; GFLOP/s, the fastest starred):\n");
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    std::printf("  %s\n", dtype_name(dt));
    for (const BenchShape& s : kBenchShapes) {
      const auto timings = kc::gemm_measure(dt, s.ta, s.tb, s.M, s.N, s.K);
      size_t best = 0;
      for (size_t i = 1; i < timings.size(); ++i)
        if (timings[i].seconds < timings[best].seconds) best = i;
      std::printf("    %-15s %c%c %4dx%4dx%4d ", s.what, s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K);
      for (size_t i = 0; i < timings.size(); ++i)
        std::printf("  %s %6.1f%s", timings[i].backend.c_str(), timings[i].gflops, i == best ? "*" : " ");
      std::printf("\n");
    }
  }
  const std::string file = kc::gemm_cache_file();
  std::printf("choices recorded for this machine in: %s\n",
              file.empty() ? "(nowhere: TROUPE_GEMM_CACHE)" : file.c_str());
}

// Whether the CUDA backend is built and loads here (kernels/cuda_backend.hpp), and its devices.
std::string cuda_line() {
  if (!kHaveCuda) return "not built";
  std::string why;
  const kernels::CudaBackend* cuda = kernels::cuda_backend(&why);
  if (cuda == nullptr) return "built, but it does not load: " + why;
  const int n = cuda->device_count(&why);
  return "built, loads; " + std::to_string(n) + " device" + (n == 1 ? "" : "s") + (n == 0 ? ": " + why : "");
}

}  // namespace

void add_version_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("version", "Print the version and what this build supports");
  auto bench = std::make_shared<bool>(false);  // the callback keeps it alive
  cmd->add_flag("--bench", *bench, "Also time every GEMM backend on training shapes (a few seconds)");
  cmd->callback([exit_code, bench] {
    std::string cpu;
    try {
      const kc::CpuFeatures& f = kc::cpu_features();
      cpu = f.model + " (" + kc::cpu_feature_list(f) + (f.cap.empty() ? "" : ", capped at " + f.cap) + ")";
    } catch (const std::exception& e) {
      std::cerr << "troupe: " << e.what() << "\n";
      *exit_code = kUsage;
      return;
    }
    std::cout << "troupe " << kVersion << "\n"
              << "  cpu:       " << cpu << "\n"
              << "  cuda/nccl: " << cuda_line() << "\n"
              << "  cpu gemm:  " << kc::gemm_backend() << "\n"
              << "  bf16 gemm: " << kc::half_gemm_description(DType::bf16) << "\n"
              << "  fp16 gemm: " << kc::half_gemm_description(DType::f16) << "\n"
              << "  precisions: fp32, bf16, fp16\n"
              << std::flush;
    if (*bench) print_bench();
    *exit_code = kOk;
  });
}

}  // namespace troupe::cli
