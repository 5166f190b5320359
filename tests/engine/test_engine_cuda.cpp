// The engine on resources.device: cuda against the same job on the CPU: a GPT and a llama
// follow the CPU losses (fp32 within 1e-4, bf16 within 2e-2 relative), a GPU run resumes bit
// for bit, a GPU checkpoint resumes on the CPU, and optimizer offload (AdamW on the CPU) follows
// the on-device run within 1e-6 with less device memory. Every case needs a CUDA device (tagged
// [gpu]): without one it warns and ctest reports it skipped (tests/support/gpu.hpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "core/safetensors.hpp"
#include "core/spec.hpp"
#include "tests/support/gpu.hpp"
#include "tests/support/support.hpp"
#include "worker/engine.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

JobSpec spec_on(const std::string& device, const std::string& model, const std::string& train_extra) {
  const std::string y = "name: t\nmodel: " + model +
                        "\ndata: {source: synthetic}\n"
                        "train: {steps: 20, global_batch: 8, micro_batch: 4, seed: 5, warmup_steps: 2, "
                        "optimizer: {lr: 0.003}" +
                        train_extra + "}\nresources: {device: " + device + "}\n";
  return parse_spec(y, device + ".yaml");
}

const char* kGpt = "{type: gpt, seq_len: 32, d_model: 64, n_layers: 2, n_heads: 4}";
const char* kLlama =
    "{type: llama, vocab_size: 256, seq_len: 32, d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2}";

std::vector<StepReport> run(Engine& e, int steps) {
  std::vector<StepReport> out;
  for (int i = 0; i < steps && !e.done(); ++i) out.push_back(e.step());
  return out;
}

// Every step's loss and gradient norm of the GPU run within `rel` of the CPU run's.
void follows(const std::string& model, const std::string& extra, double rel) {
  Engine cpu(spec_on("cpu", model, extra), {}), gpu(spec_on("cuda", model, extra), {});
  const std::vector<StepReport> a = run(cpu, 20), b = run(gpu, 20);
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == 20);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i << ": cpu loss " << a[i].loss << ", cuda loss " << b[i].loss);
    CHECK(std::abs(b[i].loss - a[i].loss) <= rel * std::abs(a[i].loss));
    CHECK(std::abs(b[i].grad_norm - a[i].grad_norm) <= 10 * rel * std::abs(a[i].grad_norm));
  }
  CHECK(b.back().loss < b.front().loss - 0.3);  // it learns
}

}  // namespace

TEST_CASE("engine on cuda: 20 GPT steps in fp32 follow the CPU run within 1e-4", "[engine][gpu]") {
  if (!testing::have_gpu()) return;
  follows(kGpt, "", 1e-4);
}

TEST_CASE("engine on cuda: 20 GPT steps in bf16 follow the CPU bf16 run within 2e-2", "[engine][gpu]") {
  if (!testing::have_gpu()) return;
  follows(kGpt, ", precision: bf16", 2e-2);
}

TEST_CASE("engine on cuda: 20 llama steps in fp32 follow the CPU run within 1e-4", "[engine][gpu]") {
  if (!testing::have_gpu()) return;
  follows(kLlama, "", 1e-4);
}

TEST_CASE("engine on cuda: a resumed GPU run continues bit for bit, and its checkpoint resumes on the CPU",
          "[engine][gpu]") {
  if (!testing::have_gpu()) return;
  const std::string dir = testing::temp_dir("test_engine_cuda_resume");
  const JobSpec spec = spec_on("cuda", kGpt, ", eval_every: 5");
  Engine full(spec, {});
  const std::vector<StepReport> ref = run(full, 20);

  Engine first(spec, {});
  run(first, 8);
  const std::string ckpt = first.save_checkpoint(dir);
  REQUIRE(first.wait_checkpoint() == ckpt);
  EngineAssignment asg;
  asg.resume_from = ckpt;
  Engine second(spec, asg);
  REQUIRE(second.next_step() == 8);
  for (int i = 8; i < 20; ++i) {
    const StepReport r = second.step();
    REQUIRE(r.loss == ref[size_t(i)].loss);  // bit-identical
    REQUIRE(r.grad_norm == ref[size_t(i)].grad_norm);
  }

  // The same checkpoint (parameters and both moments, copied from the device) on the CPU.
  Engine on_cpu(spec_on("cpu", kGpt, ", eval_every: 5"), asg);
  REQUIRE(on_cpu.next_step() == 8);
  for (int i = 8; i < 12; ++i) {
    const StepReport r = on_cpu.step();
    CHECK(std::abs(r.loss - ref[size_t(i)].loss) <= 1e-4 * ref[size_t(i)].loss);
  }
  fs::remove_all(dir);
}

TEST_CASE("engine on cuda: optimizer offload gives the on-device losses within 1e-6 and frees the moments",
          "[engine][gpu][offload]") {
  if (!testing::have_gpu()) return;
  auto& alloc = kernels::cuda::allocator();
  std::vector<StepReport> a, b;
  size_t with_moments = 0, offloaded = 0;
  {
    Engine on(spec_on("cuda", kGpt, ""), {});
    with_moments = alloc.stats().in_use_bytes;
    a = run(on, 20);
  }
  {
    Engine off(spec_on("cuda", kGpt, ", offload: optimizer"), {});
    offloaded = alloc.stats().in_use_bytes;
    b = run(off, 20);
  }
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i);
    CHECK(std::abs(b[i].loss - a[i].loss) <= 1e-6 * std::abs(a[i].loss));
  }
  // AdamW's two f32 moments per parameter leave the device.
  INFO("device bytes in use: " << with_moments << " with the moments, " << offloaded << " offloaded");
  CHECK(with_moments > offloaded);
}

TEST_CASE("engine on cuda: troupe run over 2 GPUs (data parallel through NCCL) follows the 1-GPU run",
          "[engine][gpu]") {
  if (!testing::have_gpus(2)) return;
  const std::string dir = testing::temp_dir("test_engine_cuda_dp");
  fs::create_directories(dir);
  // The run's losses, one per step, from its metrics.jsonl.
  auto losses = [&](int data, const std::string& name) {
    const std::string spec = dir + "/" + name + ".yaml";
    std::ofstream(spec)
        << "name: " << name << "\nmodel: " << kGpt
        << "\ndata: {source: synthetic}\n"
           "train: {steps: 10, global_batch: 8, seed: 5, warmup_steps: 2, optimizer: {lr: 0.003}}\n"
           "parallel: {data: "
        << data << "}\nresources: {device: cuda}\n";
    const testing::CommandResult r =
        testing::run_troupe("run -q " + spec + " --runs-dir " + dir + "/" + name);
    INFO(r.out);
    REQUIRE(r.code == 0);
    std::vector<double> out;
    for (const auto& e : fs::directory_iterator(dir + "/" + name)) {
      std::ifstream f(e.path() / "metrics.jsonl");
      for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line).at("loss"));
    }
    return out;
  };
  const std::vector<double> one = losses(1, "one"), two = losses(2, "two");
  REQUIRE(one.size() == 10);
  REQUIRE(two.size() == 10);
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("step " << i << ": 1 GPU " << one[i] << ", 2 GPUs " << two[i]);
    CHECK(std::abs(two[i] - one[i]) <= 1e-5 * one[i]);
  }
  fs::remove_all(dir);
}
