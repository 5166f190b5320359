// `troupe plan` as the planner's dry run, and `parallel: auto` through `troupe run` with real
// worker processes. Every command here names its hardware profile or empties the calibrated
// profiles' directory, so that a calibration of the machine the tests run on changes nothing.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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
  // none and full are the candidates: selective would be none again under the fused attention.
  CHECK(r.out.find(" none ") != std::string::npos);
  CHECK(r.out.find(" full ") != std::string::npos);
  std::istringstream rows(r.out);
  for (std::string row; std::getline(rows, row);)
    if (row.find(" | ") != std::string::npos) CHECK(row.find("selective") == std::string::npos);
  CHECK(r.out.find("attention: fused causal") != std::string::npos);
  CHECK(r.out.find("rank 3: ") != std::string::npos);  // the chosen plan's ranks
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
    CHECK(x["candidate"].get<std::string>().rfind(x["layout"].get<std::string>() + " mb", 0) == 0);
    CHECK(!x["reason"].get<std::string>().empty());
    heads = heads || (x["layout"] == "1x1x4" && x["reason"] == "n_heads (2) is not divisible by tensor (4)");
  }
  CHECK(heads);
  // Every candidate counted is ranked or rejected, once.
  CHECK(j["plans"].size() + j["rejected"].size() == j["candidates"].get<size_t>());
  CHECK(j["counts"]["ranked"] == j["plans"].size());
  CHECK(j["counts"]["rejected"] == j["rejected"].size());
  CHECK(j["attention"] == "fused");
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

namespace {

// The 2024-class Llama of docs/planner.md: 126 layers on 64 x 16 x 8 H100s.
std::string llama_405b(const std::string& schedule) {
  return "name: llama-405b\n"
         "model: {type: llama, vocab_size: 128256, seq_len: 8192, d_model: 16384, n_layers: 126, n_heads: "
         "128, "
         "n_kv_heads: 8, ffn_hidden: 53248, tie_embeddings: false}\n"
         "data: {source: tokens, dtype: uint32, path: /nonexistent.bin}\n"
         "train: {steps: 10, global_batch: 2048, micro_batch: auto, recompute: auto, precision: bf16, zero: "
         "1}\n"
         "parallel: {data: 64, pipeline: 16, tensor: 8, schedule: " +
         schedule + ", sequence_parallel: true" +
         (schedule == "interleaved" ? ", virtual_stages: auto" : "") +
         "}\n"
         "resources: {device: cuda, hardware: h100-sxm}\n";
}

}  // namespace

TEST_CASE("cli: plan accounts for every candidate of a 126-layer Llama and interleaves it unevenly",
          "[cli][planner]") {
  const std::string dir = temp_dir("llama");
  const std::string spec = write(dir, "llama.yaml", llama_405b("interleaved"));
  CommandResult r = troupe_cmd("plan " + spec + " --json", dir);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["candidates"] == 72);
  CHECK(j["plans"].size() + j["rejected"].size() == 72);
  for (const auto& x : j["rejected"])
    CHECK(x["reason"].get<std::string>().find("do not divide into") == std::string::npos);
  const nlohmann::json& c = j["chosen"];
  CHECK(c["schedule"] == "interleaved");
  CHECK(c["virtual_stages"].get<int>() >= 2);
  const std::vector<int> b = c["boundaries"];
  CHECK(b.size() == size_t(16 * c["virtual_stages"].get<int>() + 1));
  CHECK(b.back() == 126);
  CHECK(j["attention_assumed"].get<std::string>().find("flash-style") != std::string::npos);
  // The text says which attention it assumed and groups the rejections by reason.
  CommandResult t = troupe_cmd("plan " + spec, dir);
  CHECK(t.code == 0);
  CHECK(t.out.find("attention: fused causal, flash-style") != std::string::npos);
  CHECK(t.out.find("more for this reason") != std::string::npos);
  // Priced as the published runs of 2021-22 computed attention, no recomputation needs the
  // hundreds of GiB of s x s scores; fused, it does not.
  const std::string one = write(dir, "one.yaml", llama_405b("1f1b"));
  double fused = 0, materialized = 0;
  const nlohmann::json fj = nlohmann::json::parse(troupe_cmd("plan " + one + " --json", dir).out);
  for (const auto& p : fj["rejected"])
    if (p["candidate"] == "64x16x8 mb1 none") fused = std::stod(p["reason"].get<std::string>().substr(6));
  CommandResult m = troupe_cmd("plan " + one + " --json --attention materialized", dir);
  REQUIRE(m.code == 0);
  const nlohmann::json mj = nlohmann::json::parse(m.out);
  CHECK(mj["attention"] == "materialized");
  for (const auto& p : mj["rejected"])
    if (p["candidate"] == "64x16x8 mb1 none")
      materialized = std::stod(p["reason"].get<std::string>().substr(6));
  CHECK(fused > 80);
  CHECK(fused < 100);
  CHECK(materialized > 500);
  CHECK(troupe_cmd("plan " + one + " --attention flash", dir).code == 2);
  fs::remove_all(dir);
}

TEST_CASE("cli: plan on the IPU profile streams what overflows the chip and runs nothing", "[cli][planner]") {
  const std::string dir = temp_dir("ipu");
  const std::string spec = write(
      dir, "gpt.yaml",
      "name: gpt-1.3b\n"
      "model: {type: gpt, vocab_size: 51200, seq_len: 2048, d_model: 2048, n_layers: 24, n_heads: 16}\n"
      "data: {source: tokens, path: /nonexistent.bin}\n"
      "train: {steps: 10, global_batch: 512, micro_batch: auto, recompute: auto, precision: fp16, zero: 1}\n"
      "parallel: {data: auto, pipeline: auto, tensor: auto}\n"
      "resources: {device: cuda}\n");
  CommandResult r = troupe_cmd("plan " + spec + " --hardware ipu-bow --devices 64", dir);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("streaming: what overflows 0.84 GiB per device") != std::string::npos);
  CHECK(r.out.find("  stream GiB") != std::string::npos);
  CHECK(r.out.find("no IPU backend") != std::string::npos);
  CHECK(r.out.find("\nfastest: ") != std::string::npos);
  CommandResult j = troupe_cmd("plan " + spec + " --hardware ipu-bow --devices 64 --json", dir);
  REQUIRE(j.code == 0);
  const nlohmann::json c = nlohmann::json::parse(j.out)["chosen"];
  CHECK(c["memory_bytes"]["streamed"].get<double>() > 0);
  CHECK(c["memory_bytes"]["on_device"].get<double>() <= 900e6);
  CHECK(c["time_s"]["streaming"].get<double>() > 0);
  fs::remove_all(dir);
}
