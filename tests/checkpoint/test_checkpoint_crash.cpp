// Crash injection with real processes: `troupe run` (embedded coordinator, worker
// processes over gloo). TROUPE_CKPT_FAULT kills a worker half-way through its shard file,
// or the coordinator after the last shard report and before the rename; either way the
// previous checkpoint stays intact and the job resumes from it with the same losses.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

using Result = testing::CommandResult;

Result sh(const std::string& env, const std::string& args) { return testing::run_troupe(args, env); }

std::string temp_dir(const std::string& name) { return testing::temp_dir("test_ckpt_crash_" + name); }

// A 2x1x1 job (two worker processes) checkpointing every 2 steps; no automatic restart,
// so the test decides when to resume.
std::string write_spec(const std::string& dir) {
  const std::string p = dir + "/job.yaml";
  std::ofstream(p) << "name: crash\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 2}\n"
                      "data: {source: synthetic}\n"
                      "train: {steps: 6, global_batch: 4, seed: 2, optimizer: {lr: 0.003}}\n"
                      "parallel: {data: 2, pipeline: 1, tensor: 1}\n"
                      "checkpoint: {dir: "
                   << dir << "/ckpt, every: 2, keep: 3}\nfault: {max_restarts: 0}\n";
  return p;
}

// step -> loss from the metrics.jsonl of the one run under runs_dir.
std::map<int64_t, double> losses(const std::string& runs_dir) {
  std::map<int64_t, double> out;
  for (const auto& e : fs::directory_iterator(runs_dir)) {
    std::ifstream f(e.path() / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
  }
  return out;
}

void check_resume(const std::string& dir, const std::string& spec, int64_t from) {
  const std::string ckpt = dir + "/ckpt";
  REQUIRE(checkpoint::resolve(ckpt) == ckpt + "/" + checkpoint::step_dir_name(from));
  Result v = sh("", "ckpt verify " + ckpt);
  INFO(v.out);
  CHECK(v.code == 0);
  Result r = sh("", "run " + spec + " -q --runs-dir " + dir + "/runs_resumed --resume " + ckpt);
  INFO(r.out);
  REQUIRE(r.code == 0);
  Result ref = sh("", "run " + spec + " -q --runs-dir " + dir + "/runs_ref");
  REQUIRE(ref.code == 0);
  const auto got = losses(dir + "/runs_resumed"), want = losses(dir + "/runs_ref");
  REQUIRE(got.size() == size_t(6 - from));
  REQUIRE(got.begin()->first == from);
  for (const auto& [step, loss] : got) CHECK(std::abs(loss - want.at(step)) < 1e-4);
}

}  // namespace

TEST_CASE("checkpoint crash: a worker killed while writing its shard leaves the previous checkpoint",
          "[checkpoint][crash]") {
  const std::string dir = temp_dir("writer");
  const std::string spec = write_spec(dir);
  Result r = sh("TROUPE_CKPT_FAULT=write:4:1", "run " + spec + " -q --runs-dir " + dir + "/runs");
  INFO(r.out);
  REQUIRE(r.code == 1);  // the job failed: a worker was killed
  const std::string ckpt = dir + "/ckpt";
  CHECK_FALSE(fs::exists(ckpt + "/step_000004"));
  // Rank 1's half file lies in the uncommitted directory; nothing reads it.
  REQUIRE(fs::exists(ckpt + "/step_000004.tmp/shard_r1.safetensors"));
  CHECK_FALSE(fs::exists(ckpt + "/step_000004.tmp/manifest.json"));
  CHECK(fs::read_symlink(ckpt + "/latest") == "step_000002");
  checkpoint::verify(ckpt + "/step_000002");
  check_resume(dir, spec, 2);
  // The resumed job's commit of step 4 replaced the leftover directory.
  CHECK_FALSE(fs::exists(ckpt + "/step_000004.tmp"));
  CHECK(checkpoint::verify(ckpt + "/step_000004").dp == 2);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint crash: the coordinator killed between the last report and the rename",
          "[checkpoint][crash]") {
  const std::string dir = temp_dir("coordinator");
  const std::string spec = write_spec(dir);
  Result r = sh("TROUPE_CKPT_FAULT=commit:4", "run " + spec + " -q --runs-dir " + dir + "/runs");
  INFO(r.out);
  REQUIRE(r.code == 128 + 9);  // SIGKILL of the process that hosts the coordinator
  const std::string ckpt = dir + "/ckpt";
  // Every shard and the manifest reached step_000004.tmp; the rename did not happen.
  CHECK(fs::exists(ckpt + "/step_000004.tmp/manifest.json"));
  CHECK(fs::exists(ckpt + "/step_000004.tmp/shard_r0.safetensors"));
  CHECK(fs::exists(ckpt + "/step_000004.tmp/shard_r1.safetensors"));
  CHECK_FALSE(fs::exists(ckpt + "/step_000004"));
  CHECK(fs::read_symlink(ckpt + "/latest") == "step_000002");
  // The orphaned workers notice the lost coordinator and exit on their own.
  check_resume(dir, spec, 2);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint crash: troupe ckpt ls, inspect, verify and export", "[checkpoint][cli]") {
  const std::string dir = temp_dir("cli");
  const std::string spec = write_spec(dir);
  REQUIRE(sh("", "run " + spec + " -q --runs-dir " + dir + "/runs").code == 0);
  const std::string ckpt = dir + "/ckpt";
  Result ls = sh("", "ckpt ls " + ckpt);
  INFO(ls.out);
  CHECK(ls.code == 0);
  CHECK(ls.out.find("step_000006") != std::string::npos);
  CHECK(ls.out.find("(latest)") != std::string::npos);
  CHECK(ls.out.find("2x1x1") != std::string::npos);
  Result in = sh("", "ckpt inspect " + ckpt);
  CHECK(in.code == 0);
  CHECK(in.out.find("optim.m.h.1.mlp.c_fc.weight") != std::string::npos);
  CHECK(in.out.find("[128, 32]") != std::string::npos);
  Result ex = sh("", "ckpt export " + ckpt + " --out " + dir + "/model.safetensors");
  CHECK(ex.code == 0);
  CHECK(fs::file_size(dir + "/model.safetensors") > 0);
  // init_from accepts the exported file and the checkpoint root alike.
  for (const std::string& from : {dir + "/model.safetensors", ckpt}) {
    std::ofstream(dir + "/init.yaml")
        << "name: init\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 2, "
           "n_heads: 2, init_from: "
        << from
        << "}\ndata: {source: synthetic}\ntrain: {steps: 1, global_batch: 4, seed: 9}\n"
           "parallel: {data: 1, pipeline: 1, tensor: 2}\n";
    Result i = sh("", "run " + dir + "/init.yaml -q --runs-dir " + dir + "/runs_init");
    INFO(i.out);
    CHECK(i.code == 0);
  }
  // Damage: verify names it and exits 1; ls marks it.
  fs::resize_file(ckpt + "/step_000006/shard_r0.safetensors", 100);
  Result v = sh("", "ckpt verify " + ckpt);
  CHECK(v.code == 1);
  CHECK(v.out.find("BAD") != std::string::npos);
  CHECK(v.out.find("truncated") != std::string::npos);
  CHECK(sh("", "ckpt ls " + ckpt).out.find("BAD") != std::string::npos);
  fs::remove_all(dir);
}
