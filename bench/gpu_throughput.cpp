// Training throughput of the engine on one GPU (resources.device: cuda, train.precision: bf16)
// next to PyTorch on the same GPU, model and batch: tokens/s, MFU against the GPU's dense bf16
// peak, and peak device memory.
//
//   gpu_throughput [--steps N=10] [--warmup W=3] [--config 124m|1.3b|all] [--peak-tflops P=989]
//                  [--no-torch] [--python python3] [--script PATH]
// --script: bench/torch_reference.py (default: the source tree's, else ./bench/'s).
//
// Configs (bench/torch_reference.py has the same presets):
//   124m: GPT-2 small, 12 x 768, 12 heads, seq 1024, vocab 50257, batch 16.
//   1.3b: GPT-3 XL's shape, 24 x 2048, 16 heads, seq 1024, vocab 50257, batch 8.
// The data is random token ids, written once to a token file in a temporary directory.
//
// Rows, each in its own process, one after the other (the GPU is never shared):
//   troupe         the engine, 1x1x1 on cuda:0, bf16 products with f32 master weights,
//                  grad_clip 1.0 (this executable again, in the hidden --one=<config> mode);
//   torch eager    bench/torch_reference.py --device cuda --autocast bf16 --sdpa;
//   torch compile  the same under torch.compile.
// A row that cannot run says why (no torch, no GPU) and the others still print; the exit
// status is 1 when the engine's row could not run, 0 otherwise.
//
// FLOPs per token: bench/flops.hpp, from the parameters each row reports (the same model on
// both sides); MFU = tokens/s * FLOPs per token / peak. The default peak is the H200's (and
// H100 SXM's) dense bf16 figure, 989 TFLOP/s.
// Peak memory: the engine's device allocator's peak in-use bytes
// (kernels::cuda::allocator()), PyTorch's torch.cuda.max_memory_allocated().
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/child_process.hpp"
#include "bench/flops.hpp"
#include "core/spec.hpp"
#include "core/token_writer.hpp"
#include "kernels/cuda/cuda.hpp"
#include "worker/engine.hpp"

namespace {

struct Config {
  const char* name;
  int layers, d_model, heads, seq_len, batch, vocab;
};

const Config kConfigs[] = {{"124m", 12, 768, 12, 1024, 16, 50257}, {"1.3b", 24, 2048, 16, 1024, 8, 50257}};

const Config* find_config(const std::string& name) {
  for (const Config& c : kConfigs)
    if (name == c.name) return &c;
  return nullptr;
}

// The hidden child mode: trains the config on cuda:0 and prints one report line.
int run_troupe(const Config& c, int steps, int warmup) {
  namespace fs = std::filesystem;
  std::string why;
  if (troupe::kernels::cuda::device_count(&why) == 0) {
    std::printf("unavailable=no CUDA device (%s)\n", why.c_str());
    return 3;
  }
  const fs::path dir = fs::temp_directory_path() / ("troupe_gpu_throughput_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const size_t n_tokens = size_t(c.batch) * (c.seq_len + 1) * size_t(steps + warmup + 4) * 2;
  std::vector<uint32_t> ids(n_tokens);
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> pick(0, uint32_t(c.vocab - 1));
  for (auto& t : ids) t = pick(rng);
  const std::string data = (dir / "train.bin").string();
  troupe::write_token_file(data, ids.data(), ids.size(), uint64_t(c.vocab));

  char yaml[1024];
  std::snprintf(yaml, sizeof yaml,
                "name: gpu-throughput-%s\n"
                "model: {type: gpt, vocab_size: %d, seq_len: %d, d_model: %d, n_layers: %d, n_heads: %d}\n"
                "data: {source: tokens, path: %s}\n"
                "train: {steps: %d, global_batch: %d, micro_batch: %d, precision: bf16, grad_clip: 1.0, "
                "eval_every: 0, optimizer: {lr: 3e-4, weight_decay: 0.1}}\n"
                "resources: {device: cuda}\n",
                c.name, c.vocab, c.seq_len, c.d_model, c.layers, c.heads, data.c_str(), steps + warmup,
                c.batch, c.batch);
  const troupe::JobSpec spec = troupe::parse_spec(yaml, "gpu_throughput.yaml");
  troupe::Engine engine(spec, {});
  std::vector<double> ms;
  double loss = 0;
  for (int i = 0; i < steps + warmup; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    loss = engine.step().loss;
    troupe::kernels::cuda::synchronize();  // the step's last kernels (AdamW, the bf16 copy) included
    const double dt =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) ms.push_back(dt);
  }
  std::sort(ms.begin(), ms.end());
  const double median_ms = ms[ms.size() / 2];
  const double tps = double(c.batch) * c.seq_len / (median_ms * 1e-3);
  const auto st = troupe::kernels::cuda::allocator().stats();
  std::printf("tokens_per_s=%.1f peak_device_bytes=%zu last_loss=%.4f params=%lld\n", tps,
              st.peak_in_use_bytes, loss, static_cast<long long>(engine.num_params()));
  fs::remove_all(dir);
  return 0;
}

struct Row {
  std::string name, why;
  double tps = std::nan(""), peak_bytes = std::nan(""), loss = std::nan(""), params = std::nan("");
};

Row from_child(const std::string& name, const troupe::bench::ChildRun& r) {
  Row row;
  row.name = name;
  if (!r.started) {
    row.why = std::string("could not start: ") + std::strerror(r.exec_errno);
    return row;
  }
  row.tps = troupe::bench::report_value(r.out, "tokens_per_s");
  row.peak_bytes = troupe::bench::report_value(r.out, "peak_device_bytes");
  row.loss = troupe::bench::report_value(r.out, "last_loss");
  row.params = troupe::bench::report_value(r.out, "params");
  if (std::isnan(row.tps)) {
    row.why = troupe::bench::report_text(r.out, "unavailable", true);
    if (row.why.empty())
      row.why = r.signal ? "killed by signal " + std::to_string(r.signal)
                         : "exited with " + std::to_string(r.exit_code) + " without a figure";
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 10, warmup = 3;
  std::string config = "all", one, python = "python3", script;
  double peak_tflops = 989.0;
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gpu_throughput: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps")
      steps = std::atoi(value("--steps").c_str());
    else if (a == "--warmup")
      warmup = std::atoi(value("--warmup").c_str());
    else if (a == "--config")
      config = value("--config");
    else if (a == "--peak-tflops")
      peak_tflops = std::atof(value("--peak-tflops").c_str());
    else if (a == "--python")
      python = value("--python");
    else if (a == "--script")
      script = value("--script");
    else if (a == "--no-torch")
      torch = false;
    else if (a.rfind("--one=", 0) == 0)
      one = a.substr(6);
    else {
      std::fprintf(
          stderr,
          "usage: gpu_throughput [--steps N] [--warmup W] [--config 124m|1.3b|all] [--peak-tflops P] "
          "[--no-torch] [--python PY] [--script PATH]\n");
      return 2;
    }
  }
  if (steps < 1 || warmup < 0 || peak_tflops <= 0 || (config != "all" && !find_config(config))) {
    std::fprintf(stderr, "gpu_throughput: bad --steps, --warmup, --peak-tflops or --config\n");
    return 2;
  }
  if (!one.empty()) {
    const Config* c = find_config(one);
    if (c == nullptr) return 2;
    try {
      return run_troupe(*c, steps, warmup);
    } catch (const std::exception& e) {
      std::printf("unavailable=%s\n", e.what());
      return 1;
    }
  }

  const std::string self = troupe::bench::self_executable(argv[0]);
  if (script.empty()) {
    script = std::string(TROUPE_SOURCE_DIR) + "/bench/torch_reference.py";
    if (!std::filesystem::exists(script)) script = "bench/torch_reference.py";
  }
  std::printf("gpu_throughput: %d timed steps after %d warm-up, bf16, MFU against %.0f TFLOP/s\n", steps,
              warmup, peak_tflops);
  bool failed = false;
  std::printf("%-6s %-14s %12s %8s %14s %9s %10s\n", "config", "row", "tokens/s", "MFU", "peak memory",
              "loss", "vs eager");
  for (const Config& c : kConfigs) {
    if (config != "all" && config != c.name) continue;
    std::vector<Row> rows;
    rows.push_back(from_child(
        "troupe", troupe::bench::run_child({self, "--one=" + std::string(c.name), "--steps",
                                            std::to_string(steps), "--warmup", std::to_string(warmup)},
                                           false)));
    if (torch)
      for (bool compiled : {false, true}) {
        std::vector<std::string> args = {python,
                                         script,
                                         "--device",
                                         "cuda",
                                         "--config",
                                         c.name,
                                         "--autocast",
                                         "bf16",
                                         "--sdpa",
                                         "--steps",
                                         std::to_string(steps),
                                         "--warmup",
                                         std::to_string(warmup + (compiled ? 2 : 0))};
        if (compiled) args.push_back("--compile");
        rows.push_back(
            from_child(compiled ? "torch compile" : "torch eager", troupe::bench::run_child(args, true)));
      }
    const double eager = rows.size() > 1 ? rows[1].tps : std::nan("");
    for (const Row& r : rows) {
      if (!r.why.empty()) {
        std::printf("%-6s %-14s unavailable: %s\n", c.name, r.name.c_str(), r.why.c_str());
        continue;
      }
      const double flops = troupe::bench::gpt_flops_per_token(static_cast<long long>(r.params), c.layers,
                                                              c.d_model, c.seq_len);
      const double mfu = r.tps * flops / (peak_tflops * 1e12);
      std::printf("%-6s %-14s %12.0f %7.1f%% %11.2f GiB %9.4f %9.2fx\n", c.name, r.name.c_str(), r.tps,
                  100 * mfu, r.peak_bytes / double(1ull << 30), r.loss,
                  std::isnan(eager) ? std::nan("") : r.tps / eager);
    }
    std::fflush(stdout);
    if (!rows.front().why.empty()) failed = true;  // the engine's row; PyTorch's may be missing
  }
  return failed ? 1 : 0;
}
