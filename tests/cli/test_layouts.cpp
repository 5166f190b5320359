// Every shipped layout, run through `troupe run` with real worker processes over gloo,
// trains the 1x1x1 model: the same loss at every step and the same final parameters,
// up to float summation order.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

// Runs `troupe run -q <config>` into its own runs root; returns the run directory.
std::string run_config(const std::string& config, const std::string& root) {
  fs::remove_all(root);
  std::string cmd = std::string("cd ") + TROUPE_SOURCE_DIR + " && " + TROUPE_BINARY_DIR + "/troupe run -q " +
                    config + " --runs-dir " + root + " > " + root + ".log 2>&1";
  int st = std::system(cmd.c_str());
  std::ifstream log(root + ".log");
  std::string out((std::istreambuf_iterator<char>(log)), {});
  INFO(config << ":\n" << out);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(root)) runs.push_back(e.path().string());
  REQUIRE(runs.size() == 1);
  return runs[0];
}

std::vector<double> losses(const std::string& run) {
  std::ifstream f(run + "/metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

}  // namespace

TEST_CASE("layouts: every configs/layouts file gives the 1x1x1 losses and final parameters",
          "[cli][layouts]") {
  const std::string tmp =
      (fs::temp_directory_path() / ("troupe_layouts_" + std::to_string(::getpid()))).string();
  fs::create_directories(tmp);
  const std::string ref_run = run_config("configs/layouts/tiny_dp1_pp1_tp1.yaml", tmp + "/ref");
  const std::vector<double> ref = losses(ref_run);
  REQUIRE(ref.size() == 10);
  const std::string ref_ckpt = checkpoint::resolve(ref_run + "/ckpt");
  const checkpoint::Manifest ref_m = checkpoint::verify(ref_ckpt);

  int layouts = 0;
  for (const auto& e : fs::directory_iterator(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts")) {
    const std::string name = e.path().stem().string();
    if (name == "tiny_dp1_pp1_tp1") continue;
    ++layouts;
    INFO("layout " << name);
    const std::string run = run_config("configs/layouts/" + name + ".yaml", tmp + "/" + name);
    const std::vector<double> got = losses(run);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == Approx(ref[i]).epsilon(1e-4));

    const std::string ckpt = checkpoint::resolve(run + "/ckpt");
    const checkpoint::Manifest m = checkpoint::verify(ckpt);
    CHECK(m.step == 10);
    for (const auto& tensor : checkpoint::tensor_names(ref_ckpt, ref_m)) {
      if (tensor.rfind("optim.", 0) == 0) continue;
      Tensor a = checkpoint::read_full(ckpt, m, tensor), b = checkpoint::read_full(ref_ckpt, ref_m, tensor);
      REQUIRE(a.shape() == b.shape());
      // Float summation order differs between layouts, and AdamW divides each gradient by
      // its own running size, so single elements with near-zero gradients drift most: compare
      // the largest element difference and the relative norm of the difference.
      double max_abs = 0, diff2 = 0, ref2 = 0;
      for (int64_t i = 0; i < a.numel(); ++i) {
        const double d = double(a.f32()[i]) - double(b.f32()[i]);
        max_abs = std::max(max_abs, std::abs(d));
        diff2 += d * d;
        ref2 += double(b.f32()[i]) * double(b.f32()[i]);
      }
      INFO("parameter " << tensor);
      CHECK(max_abs < 1e-4);
      CHECK(std::sqrt(diff2) <= 1e-4 * std::sqrt(ref2) + 1e-7);
    }
  }
  CHECK(layouts >= 9);
  fs::remove_all(tmp);
}
