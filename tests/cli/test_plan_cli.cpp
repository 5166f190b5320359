// `troupe plan` as the planner's dry run, and `parallel: auto` through `troupe run` with real
// worker processes. Every command here names its hardware profile or empties the calibrated
// profiles' directory, so that a calibration of the machine the tests run on changes nothing.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using troupe::testing::CommandResult;

namespace {

std::string temp_dir(const std::string& name) { return troupe::testing::temp_dir("test_plan_cli_" + name); }

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string p = dir + "/" + name;
  std::ofstream(p) << text;
  return p;
}

// No calibrated profiles: the built-in `cpu` one.
CommandResult troupe_cmd(const std::string& args, const std::string& dir) {
  return troupe::testing::run_troupe(args, "TROUPE_HARDWARE_DIR=" + dir + "/no-profiles");
}

const char* kAuto =
    "name: auto\n"
    "model: {type: gpt, seq_len: 32, d_model: 64, n_layers: 4, n_heads: 2}\n"
    "data: {source: synthetic}\n"
    "train: {steps: 6, global_batch: 8, micro_batch: auto, recompute: auto, seed: 0}\n"
    "parallel: {data: auto, pipeline: auto, tensor: auto}\n";

}  // namespace

TEST_CASE("cli: plan ranks every candidate, marks the choice, and explains it", "[cli][planner]") {
  const std::string dir = temp_dir("table");
  const std::string spec = write(dir, "auto.yaml", kAuto);
  CommandResult r = troupe_cmd("plan " + spec + " --devices 4 --top 50", dir);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("on 4 devices, hardware cpu") != std::string::npos);
  for (const char* col : {"layout", "mb", "recompute", "step s", "tokens/s", "MFU", "params", "grads",
                          "optim", "activ", "total GiB", "bubble", "comm", "runs here"})
    CHECK(r.out.find(col) != std::string::npos);
  CHECK(r.out.find("\n* 1 ") != std::string::npos);  // the first is the choice
  CHECK(r.out.find("chosen: ") != std::string::npos);
  CHECK(r.out.find("s/step predicted") != std::string::npos);
  CHECK(r.out.find("rejected:") != std::string::npos);
  CHECK(r.out.find(" selective ") != std::string::npos);  // every recompute mode is a candidate
  CHECK(r.out.find("rank 3: ") != std::string::npos);     // the chosen plan's ranks
  fs::remove_all(dir);
}

TEST_CASE("cli: plan --json is one object: plans best first, rejected with reasons, the choice",
          "[cli][planner]") {
  const std::string dir = temp_dir("json");
  const std::string spec = write(dir, "auto.yaml", kAuto);
  CommandResult r = troupe_cmd("plan " + spec + " --devices 4 --json", dir);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  REQUIRE(j["plans"].is_array());
  REQUIRE(!j["plans"].empty());
  double last = 0;
  for (const auto& p : j["plans"]) {
    for (const char* k :
         {"data", "pipeline", "tensor", "virtual_stages", "micro_batch", "recompute", "sequence_parallel",
          "step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "fits", "runnable"})
      CHECK(p.contains(k));
    for (const char* k : {"params", "grads", "optimizer", "activations", "total"})
      CHECK(p["memory_bytes"][k].get<double>() >= 0);
    CHECK(p["data"].get<int>() * p["pipeline"].get<int>() * p["tensor"].get<int>() == 4);
    CHECK(p["fits"] == true);
    CHECK(p["step_time_s"].get<double>() >= last);  // best first
    last = p["step_time_s"];
  }
  REQUIRE(j["rejected"].is_array());
  bool heads = false;
  for (const auto& x : j["rejected"]) {
    CHECK(x.contains("layout"));
    heads = heads || (x["layout"] == "1x1x4" && x["reason"] == "n_heads (2) is not divisible by tensor (4)");
  }
  CHECK(heads);
  CHECK(j["chosen"]["runnable"] == true);
  CHECK(j["explanation"].get<std::string>().find("s/step predicted") != std::string::npos);
  // A spec that fixes every degree holds that one layout.
  const std::string fixed =
      write(dir, "fixed.yaml",
            std::string(kAuto).replace(std::string(kAuto).find("data: auto"),
                                       std::string("data: auto, pipeline: auto, tensor: auto").size(),
                                       "data: 2, pipeline: 2, tensor: 1"));
  CommandResult f = troupe_cmd("plan " + fixed + " --json", dir);
  REQUIRE(f.code == 0);
  for (const auto& p : nlohmann::json::parse(f.out)["plans"]) {
    CHECK(p["data"] == 2);
    CHECK(p["pipeline"] == 2);
    CHECK(p["tensor"] == 1);
  }
  fs::remove_all(dir);
}

TEST_CASE("cli: plan holds a fixed layout, and refuses --devices that it does not have", "[cli][planner]") {
  const std::string dir = temp_dir("fixed");
  const std::string spec = write(dir, "fixed.yaml",
                                 "name: fixed\n"
                                 "model: {type: gpt, seq_len: 32, d_model: 64, n_layers: 4, n_heads: 2}\n"
                                 "data: {source: synthetic}\n"
                                 "train: {steps: 6, global_batch: 8, micro_batch: 2, seed: 0}\n"
                                 "parallel: {data: 2, pipeline: 2, tensor: 1}\n");
  CommandResult same = troupe_cmd("plan " + spec + " --devices 4", dir);
  INFO(same.out);
  CHECK(same.code == 0);
  CHECK(same.out.find("on 4 devices") != std::string::npos);
  CommandResult other = troupe_cmd("plan " + spec + " --devices 8", dir);
  CHECK(other.code == 2);
  CHECK(other.out.find("--devices 8") != std::string::npos);
  CHECK(other.out.find("fixes every degree (2x2x1)") != std::string::npos);
  CHECK(other.out.find("auto") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("cli: plan refuses a job nothing fits, naming the smallest memory that would", "[cli][planner]") {
  const std::string dir = temp_dir("nofit");
  const std::string spec =
      write(dir, "big.yaml", std::string(kAuto) + "resources: {memory_per_device: 64KiB}\n");
  CommandResult r = troupe_cmd("plan " + spec + " --devices 2", dir);
  CHECK(r.code == 2);
  CHECK(r.out.find("nothing fits in 0.00 GiB per device: the smallest plan") != std::string::npos);
  CHECK(r.out.find("needs ") != std::string::npos);
  // troupe run refuses it before anything starts.
  CommandResult run = troupe_cmd("run " + spec + " --devices 2 --runs-dir " + dir + "/runs", dir);
  CHECK(run.code == 2);
  CHECK(run.out.find("nothing fits") != std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/runs"));
  // A profile that is not a profile.
  CommandResult hw = troupe_cmd("plan " + spec + " --hardware " + spec, dir);
  CHECK(hw.code == 2);
  CHECK(hw.out.find("unknown key 'name'") == std::string::npos);  // a job spec has a name...
  CHECK(hw.out.find("error:") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("cli: an auto job trains through troupe run on the planned layout",
          "[cli][planner][multiprocess]") {
  const std::string dir = temp_dir("run");
  const std::string spec = write(dir, "auto.yaml", kAuto);
  CommandResult plan = troupe_cmd("plan " + spec + " --devices 2 --json", dir);
  REQUIRE(plan.code == 0);
  const nlohmann::json chosen = nlohmann::json::parse(plan.out)["chosen"];
  const std::string layout = std::to_string(chosen["data"].get<int>()) + "x" +
                             std::to_string(chosen["pipeline"].get<int>()) + "x" +
                             std::to_string(chosen["tensor"].get<int>());
  CommandResult r = troupe_cmd("run " + spec + " --devices 2 --runs-dir " + dir + "/runs", dir);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("planned for 2 device(s): " + layout) != std::string::npos);
  CHECK(r.out.find("generation 0 planned: " + layout) != std::string::npos);
  // Every step ran on the planned layout, and the workers got the planned spec.
  std::string run_dir;
  for (const auto& e : fs::directory_iterator(dir + "/runs")) run_dir = e.path().string();
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto m = nlohmann::json::parse(line);
    if (!m.contains("loss")) continue;
    CHECK(m["layout"] == layout);
    ++steps;
  }
  CHECK(steps == 6);
  std::ifstream events(run_dir + "/events.log");
  const std::string ev((std::istreambuf_iterator<char>(events)), {});
  CHECK(ev.find("plan for generation 0: " + layout) != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("cli: plan --calibrate measures this machine into a profile that plans then read",
          "[cli][planner][multiprocess]") {
  const std::string dir = temp_dir("calibrate");
  const std::string spec =
      write(dir, "tiny.yaml",
            "name: tiny\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 2}\n"
            "data: {source: synthetic}\ntrain: {steps: 2, global_batch: 4}\n"
            "parallel: {data: auto, pipeline: auto, tensor: auto}\n");
  const std::string out = dir + "/profiles/cpu.yaml";
  CommandResult c = troupe_cmd("plan --calibrate " + spec + " --devices 2 --out " + out, dir);
  INFO(c.out);
  REQUIRE(c.code == 0);
  CHECK(c.out.find("wrote " + out) != std::string::npos);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text.find("device: cpu") != std::string::npos);
  CHECK(text.find("op: tn, dtype: fp32") != std::string::npos);   // the GEMM table, weight gradients too
  CHECK(text.find("allreduce: {latency:") != std::string::npos);  // the comm fits and tables
  CHECK(text.find("solo_speedup:") != std::string::npos);
  // A plan reads it by path, and as the `cpu` profile of the calibrated profiles' directory.
  CommandResult p = troupe_cmd("plan " + spec + " --hardware " + out, dir);
  CHECK(p.code == 0);
  CHECK(p.out.find("hardware cpu (" + out + ")") != std::string::npos);
  CommandResult q = troupe::testing::run_troupe("plan " + spec, "TROUPE_HARDWARE_DIR=" + dir + "/profiles");
  CHECK(q.code == 0);
  CHECK(q.out.find("hardware cpu (" + out + ")") != std::string::npos);
  fs::remove_all(dir);
}
