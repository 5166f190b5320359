// The `troupe` command as a user meets it: exit codes, messages, the run directory.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/support/support.hpp"

namespace fs = std::filesystem;

namespace {

using Result = troupe::testing::CommandResult;

Result cli(const std::string& args) { return troupe::testing::run_troupe(args); }

std::string temp_dir(const std::string& name) { return troupe::testing::temp_dir("test_cli_" + name); }

std::string only_subdir(const std::string& root) {
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) dirs.push_back(e.path().string());
  REQUIRE(dirs.size() == 1);
  return dirs[0];
}

const char* kTiny =
    "name: tiny\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 2}\n"
    "data: {source: synthetic}\n"
    "train: {steps: 6, global_batch: 4, seed: 1, eval_every: 3}\n"
    "checkpoint: {every: 3}\n";

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  std::string p = dir + "/" + name;
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST_CASE("cli: version and help exit 0, unknown subcommands and flags exit 2", "[cli]") {
  Result v = cli("version");
  CHECK(v.code == 0);
  CHECK(v.out.find("troupe ") != std::string::npos);
  CHECK(cli("--help").code == 0);
  CHECK(cli("run --help").code == 0);
  Result bad = cli("frobnicate");
  CHECK(bad.code == 2);
  CHECK(cli("validate --no-such-flag configs/quickstart.yaml").code == 2);
  CHECK(cli("").code == 2);
}

TEST_CASE("cli: validate accepts every shipped config and prints the resolved spec", "[cli]") {
  Result r = cli("validate configs/*.yaml configs/layouts/*.yaml");
  INFO(r.out);
  REQUIRE(r.code == 0);
  Result one = cli("validate configs/quickstart.yaml");
  REQUIRE(one.code == 0);
  // Defaults appear in the resolved spec although the file does not write them.
  CHECK(one.out.find("beta2:") != std::string::npos);
  CHECK(one.out.find("max_restarts:") != std::string::npos);
}

TEST_CASE("cli: an invalid spec exits 2 with file:line:col and starts nothing", "[cli]") {
  const std::string dir = temp_dir("invalid");
  std::string spec =
      write_file(dir, "bad.yaml",
                 "name: bad\nmodel: {type: gpt, seq_len: 16, d_model: 30, n_layers: 2, n_heads: 4}\n"
                 "data: {source: synthetic}\ntrain: {steps: 5, global_batch: 4, warmup_step: 1}\n");
  Result v = cli("validate " + spec);
  CHECK(v.code == 2);
  CHECK(v.out.find("bad.yaml:4:") != std::string::npos);  // the unknown key
  CHECK(v.out.find("did you mean") != std::string::npos);
  CHECK(v.out.find("bad.yaml:2:") != std::string::npos);  // d_model % n_heads
  Result r = cli("run " + spec + " --runs-dir " + dir + "/runs");
  CHECK(r.code == 2);
  CHECK_FALSE(fs::exists(dir + "/runs"));
  Result missing = cli("run " + dir + "/nope.yaml");
  CHECK(missing.code == 2);
  CHECK(missing.out.find("nope.yaml") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("cli: run writes the run directory, and sample and resume use its checkpoints", "[cli]") {
  const std::string dir = temp_dir("run");
  std::string spec = write_file(dir, "tiny.yaml", kTiny);
  Result r = cli("run " + spec + " --runs-dir " + dir + "/runs");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string run = only_subdir(dir + "/runs");
  CHECK(fs::path(run).filename().string().rfind("tiny-", 0) == 0);
  for (const char* f : {"spec.yaml", "events.log", "metrics.jsonl", "workers/0.log", "ckpt/latest"})
    CHECK(fs::exists(run + "/" + f));

  std::ifstream m(run + "/metrics.jsonl");
  std::string line;
  int n = 0, evals = 0;
  while (std::getline(m, line)) {
    auto j = nlohmann::json::parse(line);
    CHECK(j.at("step").get<int>() == n);
    for (const char* k : {"loss", "lr", "tokens", "tokens_per_s", "step_ms", "generation", "layout"})
      CHECK(j.contains(k));
    CHECK(j.at("layout") == "1x1x1");
    evals += j.contains("val_loss");
    ++n;
  }
  CHECK(n == 6);
  CHECK(evals == 2);
  CHECK(fs::exists(run + "/ckpt/step_000003/manifest.json"));
  CHECK(fs::exists(run + "/ckpt/step_000006/manifest.json"));

  Result s = cli("sample --ckpt " + run + "/ckpt --prompt hello --tokens 40 --seed 7");
  REQUIRE(s.code == 0);
  CHECK(s.out.rfind("hello", 0) == 0);
  CHECK(s.out.size() == 5 + 40 + 1);
  CHECK(cli("sample --ckpt " + run + "/ckpt --prompt hello --tokens 40 --seed 7").out == s.out);

  // Resuming from step 3 replays steps 3..5 with the same losses, bit for bit.
  Result again = cli("run " + spec + " --runs-dir " + dir + "/runs2 --resume " + run + "/ckpt/step_000003");
  INFO(again.out);
  REQUIRE(again.code == 0);
  const std::string run2 = only_subdir(dir + "/runs2");
  std::ifstream a(run + "/metrics.jsonl"), b(run2 + "/metrics.jsonl");
  std::vector<nlohmann::json> la, lb;
  while (std::getline(a, line)) la.push_back(nlohmann::json::parse(line));
  while (std::getline(b, line)) lb.push_back(nlohmann::json::parse(line));
  REQUIRE(lb.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(lb[i]["step"] == la[i + 3]["step"]);
    CHECK(lb[i]["loss"].get<double>() == la[i + 3]["loss"].get<double>());
  }
  CHECK(cli("sample --ckpt " + dir + "/nowhere --tokens 3").code == 2);
  fs::remove_all(dir);
}

TEST_CASE("cli: SIGINT stops a run with exit code 130", "[cli]") {
  const std::string dir = temp_dir("sigint");
  // Endless: the run is still training whenever the signal comes.
  std::string spec =
      write_file(dir, "long.yaml",
                 "name: long\nmodel: {type: gpt, seq_len: 32, d_model: 64, n_layers: 2, n_heads: 2}\n"
                 "data: {source: synthetic}\ntrain: {steps: " +
                     std::to_string(troupe::testing::kEndlessSteps) + ", global_batch: 8}\n");
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::string bin = std::string(TROUPE_BINARY_DIR) + "/troupe";
    std::string runs = dir + "/runs";
    int fd = ::open("/dev/null", O_WRONLY);
    dup2(fd, 1);
    execl(bin.c_str(), bin.c_str(), "run", spec.c_str(), "--runs-dir", runs.c_str(), (char*)nullptr);
    _exit(127);
  }
  // Wait until training has started (metrics appear), then interrupt.
  bool started = false;
  for (int i = 0; i < 600 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (fs::exists(dir + "/runs"))
      for (const auto& e : fs::directory_iterator(dir + "/runs"))
        if (fs::exists(e.path() / "metrics.jsonl") && fs::file_size(e.path() / "metrics.jsonl") > 0)
          started = true;
  }
  CHECK(started);
  ::kill(pid, SIGINT);
  // Bounded: a run that ignores the signal is killed and fails the test.
  int st = 0;
  pid_t got = 0;
  for (int i = 0; i < 600 && got == 0; ++i) {
    got = ::waitpid(pid, &st, WNOHANG);
    if (got == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (got == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    FAIL("troupe run was still running 60 s after SIGINT");
  }
  REQUIRE(got == pid);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 130);
  fs::remove_all(dir);
}
