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
#include <tuple>

#include "checkpoint/checkpoint.hpp"
#include "core/spec.hpp"
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
  CHECK(v.out.find("bf16 gemm: ") != std::string::npos);
  CHECK(troupe::testing::run_troupe("version", "TROUPE_GEMM_HALF=convert").out.find("bf16 gemm: convert") !=
        std::string::npos);
  CHECK(troupe::testing::run_troupe("version", "TROUPE_GEMM_HALF=nope").out.find("bf16 gemm: unavailable") !=
        std::string::npos);
  CHECK(v.out.find("cpu:       ") != std::string::npos);
  CHECK(v.out.find("measured per shape:") != std::string::npos);
  // --bench times every backend on a step's shapes and stars the fastest of each row.
  const auto bench = troupe::testing::run_troupe("version --bench");
  CHECK(bench.code == 0);
  CHECK(bench.out.find("GEMM backends on this core") != std::string::npos);
  CHECK(bench.out.find("bwd dW") != std::string::npos);
  CHECK(bench.out.find("*") != std::string::npos);
  // An unknown TROUPE_MAX_CPU_ISA is a usage error that names the variable.
  const auto bad_isa = troupe::testing::run_troupe("version", "TROUPE_MAX_CPU_ISA=avx9");
  CHECK(bad_isa.code == 2);
  CHECK(bad_isa.out.find("TROUPE_MAX_CPU_ISA=avx9") != std::string::npos);
  const auto capped = troupe::testing::run_troupe("version", "TROUPE_MAX_CPU_ISA=avx2");
  CHECK(capped.code == 0);
  CHECK(capped.out.find("capped at avx2") != std::string::npos);
  CHECK(capped.out.find("avx512bf16") == std::string::npos);
  CHECK(cli("--help").code == 0);
  CHECK(cli("run --help").code == 0);
  Result bad = cli("frobnicate");
  CHECK(bad.code == 2);
  CHECK(cli("validate --no-such-flag configs/quickstart.yaml").code == 2);
  CHECK(cli("").code == 2);
}

TEST_CASE("cli: validate accepts every shipped config and prints the resolved spec", "[cli]") {
  Result r = cli("validate configs/quickstart.yaml configs/mlp.yaml configs/layouts/*.yaml");
  INFO(r.out);
  REQUIRE(r.code == 0);
  // The token-data configs plan without their data (the planner reads none), and validate
  // names the file to prepare, at data.path.
  for (const char* config : {"configs/llama-small.yaml", "configs/gpt2-124m.yaml", "configs/llama-1b.yaml"}) {
    Result plan = cli(std::string("plan ") + config);
    INFO(config << ":\n" << plan.out);
    CHECK(plan.code == 0);
  }
  // llama-small before `troupe data tokenize` has written its files (here: pointed at an empty
  // directory, so that data/fortunes of this checkout does not matter).
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/configs/llama-small.yaml");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const std::string empty = temp_dir("no_data");
  for (size_t at; (at = text.find("data/fortunes/")) != std::string::npos;)
    text.replace(at, 14, empty + "/fortunes/");
  const std::string copy = write_file(empty, "llama-small.yaml", text);
  Result no_data = cli("validate " + copy);
  INFO(no_data.out);
  CHECK(no_data.code == 2);
  CHECK(no_data.out.find(copy + ":24:9: error: " + empty + "/fortunes/train.bin: no such file") !=
        std::string::npos);
  CHECK(no_data.out.find("troupe data tokenize") != std::string::npos);
  Result one = cli("validate configs/quickstart.yaml");
  REQUIRE(one.code == 0);
  // Defaults appear in the resolved spec although the file does not write them.
  CHECK(one.out.find("beta2:") != std::string::npos);
  CHECK(one.out.find("max_restarts:") != std::string::npos);
}

TEST_CASE("cli: plan prints the stage layers and every rank's place, and refuses a spec that cannot run",
          "[cli]") {
  Result r = cli("plan configs/layouts/tiny_dp2_pp2_tp2.yaml");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("layout 2x2x2, 2 micro-batches of 2 rows, 1f1b") != std::string::npos);
  CHECK(r.out.find("rank 5: dp 1 pp 0 tp 1, layers [0,2)+embedding") != std::string::npos);
  CHECK(r.out.find("rank 7: dp 1 pp 1 tp 1, layers [2,4)+head") != std::string::npos);
  const std::string dir = temp_dir("plan");
  const std::string odd =
      write_file(dir, "odd.yaml",
                 "name: odd\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 2}\n"
                 "data: {source: synthetic}\ntrain: {steps: 2, global_batch: 4}\n"
                 "parallel: {pipeline: 4}\n");
  Result bad = cli("plan " + odd);
  CHECK(bad.code == 2);
  CHECK(bad.out.find("odd.yaml:5:22: error: model.n_layers (2) is fewer than the 4 pipeline stages") !=
        std::string::npos);
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

TEST_CASE("cli: a model no known device can hold is refused by validate and run, naming its size", "[cli]") {
  const std::string dir = temp_dir("too_big");
  // d_model 65536 x 4096 layers: 211 trillion parameters, 3.4 PB on one device (run reached the
  // allocator before: "out of memory allocating 844438964797440 bytes").
  const std::string spec = write_file(
      dir, "huge.yaml",
      "name: huge\nmodel: {type: gpt, seq_len: 16, d_model: 65536, n_layers: 4096, n_heads: 1024}\n"
      "data: {source: synthetic}\ntrain: {steps: 5, global_batch: 4}\n");
  Result v = cli("validate " + spec);
  INFO(v.out);
  CHECK(v.code == 2);
  CHECK(v.out.find("huge.yaml:2:") != std::string::npos);
  CHECK(v.out.find("the model has 211,109,740,150,784 parameters") != std::string::npos);
  CHECK(v.out.find("each device holds at least 3.38 PB") != std::string::npos);
  CHECK(v.out.find(" PB of weights, gradients and optimizer state") != std::string::npos);
  CHECK(v.out.find("of the largest device troupe knows (hardware profile h200-sxm)") != std::string::npos);
  Result r = cli("run " + spec + " --runs-dir " + dir + "/runs");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("each device holds at least") != std::string::npos);
  CHECK(r.out.find("out of memory") == std::string::npos);
  CHECK_FALSE(fs::exists(dir + "/runs"));
  // Split as far as the spec lets the planner split it, the same model fits: not refused here.
  const std::string split = write_file(
      dir, "split.yaml",
      "name: split\nmodel: {type: gpt, seq_len: 16, d_model: 65536, n_layers: 4096, n_heads: 1024}\n"
      "data: {source: synthetic}\ntrain: {steps: 5, global_batch: 4}\n"
      "parallel: {data: 1, pipeline: auto, tensor: auto}\n");
  Result a = cli("validate -q " + split);
  INFO(a.out);
  CHECK(a.out.find("each device holds at least") == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("cli: the CUDA backend is a library loaded on first use, and one that does not load is named",
          "[cli]") {
  const Result v = cli("version");
  REQUIRE(v.code == 0);
  if (!troupe::build_has_cuda()) {
    CHECK(v.out.find("cuda/nccl: not built") != std::string::npos);
    return;
  }
  // The executable maps no CUDA library when it starts (ldd: what the loader maps then).
  const auto ldd = troupe::testing::run_command(std::string("ldd ") + TROUPE_BINARY_DIR + "/troupe");
  REQUIRE(ldd.code == 0);
  for (const char* lib : {"libcudart", "libcublas", "libnccl"}) {
    INFO(lib);
    CHECK(ldd.out.find(lib) == std::string::npos);
  }
  // It loads the library built next to it, which finds the rest of troupe in the executable ...
  CHECK(v.out.find("cuda/nccl: built, loads; ") != std::string::npos);
  // ... and names one that is missing or is not a troupe backend.
  const auto missing =
      troupe::testing::run_troupe("version", "TROUPE_CUDA_LIBRARY=/nonexistent/libtroupe_cuda.so");
  CHECK(missing.code == 0);
  CHECK(missing.out.find("does not load: cannot load the CUDA backend /nonexistent/libtroupe_cuda.so") !=
        std::string::npos);
  const std::string foreign = "/lib/x86_64-linux-gnu/libz.so.1";
  if (std::filesystem::exists(foreign)) {
    const auto other = troupe::testing::run_troupe("version", "TROUPE_CUDA_LIBRARY=" + foreign);
    CHECK(other.out.find(foreign + " is not a troupe CUDA backend") != std::string::npos);
  }
}

TEST_CASE("cli: cuda with a tensor group, or on a host without a GPU, is refused and starts nothing",
          "[cli]") {
  const std::string dir = temp_dir("unrunnable");
  const std::string base =
      "name: tiny\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 2}\n"
      "data: {source: synthetic}\n"
      "train:\n  steps: 2\n  global_batch: 4\n";
  const std::string one = write_file(dir, "cuda.yaml", base + "resources:\n  device: cuda\n");
  const std::string two =
      write_file(dir, "cuda2.yaml", base + "resources:\n  device: cuda\nparallel:\n  tensor: 2\n");
  const bool cuda = troupe::build_has_cuda();
  // What validate and run refuse, at file:line:col with a hint.
  std::vector<std::tuple<std::string, std::string, std::string>> refused = {
      {two, cuda ? "cuda2.yaml:10:11: error: " : "cuda2.yaml:8:11: error: ",
       cuda ? "resources.device: cuda trains over data parallelism only in this engine, not pipeline 1, "
              "tensor 2"
            : "resources.device: cuda: this build has no CUDA kernels"}};
  if (!cuda)
    refused.push_back(
        {one, "cuda.yaml:8:11: error: ", "resources.device: cuda: this build has no CUDA kernels"});
  for (const auto& [spec, where, what] : refused) {
    Result v = cli("validate " + spec);
    INFO(v.out);
    CHECK(v.code == 2);
    CHECK(v.out.find(where + what) != std::string::npos);
    CHECK(v.out.find("hint: ") != std::string::npos);
    CHECK(v.out.find("name: \"tiny\"") == std::string::npos);  // no resolved spec printed
    Result r = cli("run " + spec + " --runs-dir " + dir + "/runs");
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(where + what) != std::string::npos);
    CHECK_FALSE(fs::exists(dir + "/runs"));
  }
  if (cuda) {
    // One GPU is a valid job; a host where none is visible refuses it before any worker starts.
    Result v = cli("validate " + one);
    INFO(v.out);
    CHECK(v.code == 0);
    Result r =
        troupe::testing::run_troupe("run " + one + " --runs-dir " + dir + "/runs", "CUDA_VISIBLE_DEVICES=");
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("resources.device: cuda: the job needs 1 GPU(s), this host has 0") != std::string::npos);
    CHECK_FALSE(fs::exists(dir + "/runs"));
  }
  fs::remove_all(dir);
}

TEST_CASE("cli: run --resume refuses a damaged or missing checkpoint before anything starts", "[cli]") {
  namespace ck = troupe::checkpoint;
  const std::string dir = temp_dir("resume_damaged");
  const std::string config = "configs/layouts/tiny_dp1_pp1_tp1.yaml";
  Result made = cli("run -q " + config + " --runs-dir " + dir + "/runs");
  INFO(made.out);
  REQUIRE(made.code == 0);
  const std::string root = only_subdir(dir + "/runs") + "/ckpt";
  REQUIRE(fs::is_symlink(root + "/latest"));
  const auto committed = ck::list(root);
  REQUIRE(committed.size() == 1);
  const ck::Manifest m = ck::verify(committed[0]);
  REQUIRE_FALSE(m.files.empty());
  const std::string step = fs::path(committed[0]).filename().string();
  const std::string shard = m.files[0].name;

  // Each damaged copy is a whole checkpoint root, `latest` included.
  auto damaged_copy = [&](const std::string& name) {
    const std::string copy = dir + "/" + name;
    fs::copy(root, copy, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    REQUIRE(fs::is_symlink(copy + "/latest"));
    return copy;
  };
  const std::string runs = dir + "/runs2";
  auto resume = [&](const std::string& from) {
    return cli("run " + config + " --runs-dir " + runs + " --resume " + from);
  };
  auto refused = [&](const std::string& from, const std::string& why) {
    Result r = resume(from);
    INFO("--resume " << from << ":\n" << r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(why) != std::string::npos);
    CHECK_FALSE(fs::exists(runs));
  };

  const std::string truncated = damaged_copy("truncated");
  const uint64_t size = fs::file_size(truncated + "/" + step + "/" + shard);
  fs::resize_file(truncated + "/" + step + "/" + shard, size / 2);
  const std::string short_file = "file " + shard + " has " + std::to_string(size / 2) +
                                 " bytes, the manifest says " + std::to_string(size);
  refused(truncated + "/" + step, short_file);
  refused(truncated, short_file);  // the root: its only checkpoint is skipped, and why is said
  refused(truncated, "no valid checkpoint");

  const std::string flipped = damaged_copy("flipped");
  {
    std::fstream f(flipped + "/" + step + "/" + shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size - 1));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(size - 1));
    f.write(&c, 1);
  }
  refused(flipped + "/" + step, "file " + shard + " checksum");

  const std::string no_shard = damaged_copy("no_shard");
  fs::remove(no_shard + "/" + step + "/" + shard);
  refused(no_shard + "/" + step, "file " + shard + " is missing");

  const std::string no_manifest = damaged_copy("no_manifest");
  fs::remove(no_manifest + "/" + step + "/manifest.json");
  refused(no_manifest + "/" + step, "manifest.json is missing");
  refused(no_manifest, "manifest.json is missing");

  const std::string garbled = damaged_copy("garbled");
  std::ofstream(garbled + "/" + step + "/manifest.json") << "{\"format_version\": 1, \"fi";
  refused(garbled + "/" + step, "manifest.json: not valid JSON");

  refused(dir + "/nowhere", dir + "/nowhere: no such directory");
  refused(only_subdir(dir + "/runs"), "a run directory, not a checkpoint; its checkpoints are in");

  // The undamaged checkpoint still passes the check (and the run resumes at its last step).
  CHECK(ck::resolve_verified(root) == committed[0]);
  CHECK(ck::resolve_verified(committed[0]) == committed[0]);
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

TEST_CASE("cli: a bf16 job trains through troupe run, and its checkpoint samples and exports in bf16 or fp32",
          "[cli][half]") {
  const std::string dir = temp_dir("bf16");
  std::string text = kTiny;
  text.replace(text.find("eval_every: 3}"), 14, "eval_every: 3, precision: bf16}");
  const std::string spec = write_file(dir, "tiny.yaml", text);
  Result r = cli("run " + spec + " --runs-dir " + dir + "/runs");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string run = only_subdir(dir + "/runs");
  std::ifstream m(run + "/metrics.jsonl");
  std::string line;
  std::vector<double> loss;
  while (std::getline(m, line)) {
    auto j = nlohmann::json::parse(line);
    CHECK_FALSE(j.contains("loss_scale"));  // bf16 does not scale its loss
    loss.push_back(j.at("loss").get<double>());
  }
  REQUIRE(loss.size() == 6);
  CHECK(loss.back() < loss.front());
  // The fallback GEMM (16-bit operands widened to fp32), forced: the same curve up to fp32
  // summation order (on a CPU without AVX512-BF16 it is the default, and the same bits).
  Result conv = troupe::testing::run_troupe("run " + spec + " --runs-dir " + dir + "/convert -q",
                                            "TROUPE_GEMM_HALF=convert");
  INFO(conv.out);
  REQUIRE(conv.code == 0);
  std::ifstream mc(only_subdir(dir + "/convert") + "/metrics.jsonl");
  for (size_t i = 0; std::getline(mc, line); ++i) {
    REQUIRE(i < loss.size());
    CHECK(nlohmann::json::parse(line).at("loss").get<double>() == Approx(loss[i]).epsilon(1e-3));
  }

  Result s = cli("sample --ckpt " + run + "/ckpt --prompt hello --tokens 40 --seed 7");
  REQUIRE(s.code == 0);
  CHECK(s.out.rfind("hello", 0) == 0);
  CHECK(s.out.size() == 5 + 40 + 1);
  CHECK(cli("sample --ckpt " + run + "/ckpt --prompt hello --tokens 40 --seed 7").out == s.out);

  for (const char* dt : {"bf16", "fp32"}) {
    const std::string out = dir + "/model_" + dt + ".safetensors";
    Result e = cli("ckpt export " + run + "/ckpt --out " + out + " --dtype " + dt);
    INFO(e.out);
    REQUIRE(e.code == 0);
    CHECK(e.out.find(std::string("(") + (dt[0] == 'b' ? "bf16" : "f32") + ")") != std::string::npos);
    REQUIRE(fs::exists(out));
  }
  CHECK(fs::file_size(dir + "/model_bf16.safetensors") < fs::file_size(dir + "/model_fp32.safetensors"));
  CHECK(cli("ckpt export " + run + "/ckpt --out " + dir + "/x.safetensors --dtype int8").code != 0);
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
