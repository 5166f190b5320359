// Every shipped layout, run through `troupe run` with real worker processes over gloo,
// trains the 1x1x1 model: the same loss at every step and the same final parameters,
// up to float summation order; in bf16 every layout follows the bf16 1x1x1 run, and an
// fp16 overflow on one rank skips the step on all of them.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

// Runs `troupe run -q <config>` into its own runs root (with `env`, "NAME=value ...",
// in its environment); returns the run directory.
std::string run_config(const std::string& config, const std::string& root, const std::string& env = "") {
  fs::remove_all(root);
  std::string cmd = std::string("cd ") + TROUPE_SOURCE_DIR + " && " + env + " " + TROUPE_BINARY_DIR +
                    "/troupe run -q " + config + " --runs-dir " + root + " > " + root + ".log 2>&1";
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

std::vector<nlohmann::json> metrics(const std::string& run) {
  std::ifstream f(run + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<double> losses(const std::string& run) {
  std::vector<double> out;
  for (const auto& m : metrics(run)) out.push_back(m.at("loss").get<double>());
  return out;
}

// A shipped layout file, made to train `steps` steps in `precision`, written into dir.
std::string layout_in(const std::string& layout, const std::string& precision, int steps,
                      const std::string& dir) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/" + layout + ".yaml");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t at = text.find("  steps: 10\n");
  REQUIRE(at != std::string::npos);
  text.replace(at, 12, "  steps: " + std::to_string(steps) + "\n  precision: " + precision + "\n");
  const std::string path = dir + "/" + layout + "_" + precision + ".yaml";
  std::ofstream(path) << text;
  return path;
}

// A shipped layout file with its GPT turned into a llama of the same width: grouped-query
// attention (2 key/value heads for 4 query heads), SwiGLU, an untied head split by
// vocabulary rows under tensor parallelism; written into dir.
std::string llama_layout_in(const std::string& layout, const std::string& dir) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/" + layout + ".yaml");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"  type: gpt\n", "  type: llama\n"},
           {"  n_heads: 4\n", "  n_heads: 4\n  n_kv_heads: 2\n  ffn_hidden: 160\n"}}) {
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  }
  const std::string path = dir + "/" + layout + "_llama.yaml";
  std::ofstream(path) << text;
  return path;
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

TEST_CASE("layouts: in bf16 every layout of {1,2}^3 follows the bf16 1x1x1 run within 1e-2",
          "[cli][layouts][half]") {
  const std::string tmp =
      (fs::temp_directory_path() / ("troupe_layouts_bf16_" + std::to_string(::getpid()))).string();
  fs::create_directories(tmp);
  const int steps = 20;
  const std::vector<double> ref =
      losses(run_config(layout_in("tiny_dp1_pp1_tp1", "bf16", steps, tmp), tmp + "/ref"));
  REQUIRE(ref.size() == size_t(steps));
  const std::vector<double> f32 =
      losses(run_config(layout_in("tiny_dp1_pp1_tp1", "fp32", steps, tmp), tmp + "/f32"));
  CHECK(f32 != ref);  // bf16 computes other bits than fp32
  for (const char* name : {"tiny_dp1_pp1_tp2", "tiny_dp1_pp2_tp1_1f1b", "tiny_dp1_pp2_tp2",
                           "tiny_dp2_pp1_tp1", "tiny_dp2_pp1_tp2", "tiny_dp2_pp2_tp1", "tiny_dp2_pp2_tp2"}) {
    INFO("layout " << name);
    const std::vector<double> got = losses(run_config(layout_in(name, "bf16", steps, tmp), tmp + "/" + name));
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) CHECK(std::abs(got[i] - ref[i]) <= 1e-2 * ref[i]);
  }
  fs::remove_all(tmp);
}

TEST_CASE("layouts: an fp16 overflow on one rank of 2x1x2 skips the step on all, halves the scale, goes on",
          "[cli][layouts][half]") {
  const std::string tmp =
      (fs::temp_directory_path() / ("troupe_layouts_fp16_" + std::to_string(::getpid()))).string();
  fs::create_directories(tmp);
  const std::string run =
      run_config(layout_in("tiny_dp2_pp1_tp2", "fp16", 12, tmp), tmp + "/run", "TROUPE_INJECT_OVERFLOW=5:1");
  const std::vector<nlohmann::json> m = metrics(run);
  REQUIRE(m.size() == 12);
  for (const auto& line : m) {
    const int64_t s = line.at("step").get<int64_t>();
    INFO("step " << s << ": " << line.dump());
    CHECK(line.at("skipped").get<bool>() == (s == 5));
    CHECK(line.at("skipped_ranks").get<int>() == (s == 5 ? 4 : 0));  // every rank, or none
    CHECK(line.at("loss_scale").get<double>() == (s <= 5 ? 65536.0 : 32768.0));
    CHECK(std::isfinite(line.at("loss").get<double>()));
  }
  CHECK(m.back().at("loss").get<double>() < m.front().at("loss").get<double>());
  fs::remove_all(tmp);
}

TEST_CASE("layouts: a llama in every layout of {1,2}^3 gives the 1x1x1 losses within 1e-4",
          "[cli][layouts][llama]") {
  const std::string tmp =
      (fs::temp_directory_path() / ("troupe_layouts_llama_" + std::to_string(::getpid()))).string();
  fs::create_directories(tmp);
  const std::string ref_run = run_config(llama_layout_in("tiny_dp1_pp1_tp1", tmp), tmp + "/ref");
  const std::vector<double> ref = losses(ref_run);
  REQUIRE(ref.size() == 10);
  CHECK(ref.back() < ref.front());
  const std::string ref_ckpt = checkpoint::resolve(ref_run + "/ckpt");
  const checkpoint::Manifest ref_m = checkpoint::verify(ref_ckpt);
  for (const char* name : {"tiny_dp1_pp1_tp2", "tiny_dp1_pp2_tp1_1f1b", "tiny_dp1_pp2_tp2",
                           "tiny_dp2_pp1_tp1", "tiny_dp2_pp1_tp2", "tiny_dp2_pp2_tp1", "tiny_dp2_pp2_tp2"}) {
    INFO("layout " << name);
    const std::string run = run_config(llama_layout_in(name, tmp), tmp + "/" + name);
    const std::vector<double> got = losses(run);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) CHECK(std::abs(got[i] - ref[i]) <= 1e-4 * ref[i]);
    // The checkpoint holds the same model whatever the layout: lm_head and wte whole,
    // assembled from the vocabulary shards.
    const std::string ckpt = checkpoint::resolve(run + "/ckpt");
    const checkpoint::Manifest m = checkpoint::verify(ckpt);
    for (const char* tensor : {"wte.weight", "lm_head.weight", "h.1.attn.c_attn.weight"}) {
      INFO("parameter " << tensor);
      Tensor a = checkpoint::read_full(ckpt, m, tensor), b = checkpoint::read_full(ref_ckpt, ref_m, tensor);
      REQUIRE(a.shape() == b.shape());
      double max_abs = 0;
      for (int64_t i = 0; i < a.numel(); ++i)
        max_abs = std::max(max_abs, std::abs(double(a.f32()[i]) - double(b.f32()[i])));
      CHECK(max_abs < 1e-4);
    }
  }
  fs::remove_all(tmp);
}

namespace {

// A shipped layout file with its model deepened to `layers` blocks, the pipeline and virtual
// stages set: written into dir.
std::string deeper_in(const std::string& layout, int layers, int pipeline, int virtual_stages,
                      const std::string& dir) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/configs/layouts/" + layout + ".yaml");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"  n_layers: 4\n", "  n_layers: " + std::to_string(layers) + "\n"},
           {"  pipeline: 2\n", "  pipeline: " + std::to_string(pipeline) + "\n"},
           {"  virtual_stages: 2\n", "  virtual_stages: " + std::to_string(virtual_stages) + "\n"}}) {
    const size_t at = text.find(from);
    if (at != std::string::npos) text.replace(at, from.size(), to);
  }
  const std::string path =
      dir + "/" + layout + "_" + std::to_string(pipeline) + "x" + std::to_string(virtual_stages) + ".yaml";
  std::ofstream(path) << text;
  return path;
}

// The chunk sizes a run's plan gave rank 0's log ("plan: ..., chunks [0,1)+embedding [1,3) ...").
std::vector<int> chunk_sizes(const std::string& run) {
  std::ifstream log(run + "/workers/0.log");
  std::string line, plan;
  while (std::getline(log, line))
    if (line.rfind("plan: ", 0) == 0) plan = line;
  std::vector<int> sizes;
  for (size_t at = plan.find(" ["); at != std::string::npos; at = plan.find(" [", at + 1)) {
    const int first = std::stoi(plan.substr(at + 2)), last = std::stoi(plan.substr(plan.find(',', at) + 1));
    sizes.push_back(last - first);
  }
  return sizes;
}

}  // namespace

TEST_CASE("layouts: interleaved chunks that do not divide the layers give the 1x1x1 losses and parameters",
          "[cli][layouts][uneven]") {
  const std::string tmp =
      (fs::temp_directory_path() / ("troupe_layouts_uneven_" + std::to_string(::getpid()))).string();
  fs::create_directories(tmp);
  // 9 blocks: 1x2x1 with 3 chunks per rank (6 chunks) and 1x4x1 with 2 (8 chunks).
  const std::string ref_run = run_config(deeper_in("tiny_dp1_pp1_tp1", 9, 1, 1, tmp), tmp + "/ref");
  const std::vector<double> ref = losses(ref_run);
  REQUIRE(ref.size() == 10);
  CHECK(ref.back() < ref.front());
  const std::string ref_ckpt = checkpoint::resolve(ref_run + "/ckpt");
  const checkpoint::Manifest ref_m = checkpoint::verify(ref_ckpt);
  for (auto [pp, v] : {std::pair{2, 3}, std::pair{4, 2}}) {
    INFO("1x" << pp << "x1, " << v << " virtual stages");
    const std::string run = run_config(deeper_in("tiny_dp1_pp2_tp1_interleaved", 9, pp, v, tmp),
                                       tmp + "/pp" + std::to_string(pp));
    const std::vector<int> sizes = chunk_sizes(run);
    REQUIRE(sizes.size() == size_t(pp * v));
    CHECK(*std::min_element(sizes.begin(), sizes.end()) < *std::max_element(sizes.begin(), sizes.end()));
    CHECK(sizes.front() == 1);  // the embedding's chunk
    CHECK(sizes.back() == 1);   // the head's
    const std::vector<double> got = losses(run);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == Approx(ref[i]).epsilon(1e-4));
    const std::string ckpt = checkpoint::resolve(run + "/ckpt");
    const checkpoint::Manifest m = checkpoint::verify(ckpt);
    for (const auto& tensor : checkpoint::tensor_names(ref_ckpt, ref_m)) {
      if (tensor.rfind("optim.", 0) == 0) continue;
      INFO("parameter " << tensor);
      Tensor a = checkpoint::read_full(ckpt, m, tensor), b = checkpoint::read_full(ref_ckpt, ref_m, tensor);
      REQUIRE(a.shape() == b.shape());
      double max_abs = 0;
      for (int64_t i = 0; i < a.numel(); ++i)
        max_abs = std::max(max_abs, std::abs(double(a.f32()[i]) - double(b.f32()[i])));
      CHECK(max_abs < 1e-4);
    }
  }
  fs::remove_all(tmp);
}
