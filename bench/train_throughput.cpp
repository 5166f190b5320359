// Training throughput of the 1x1x1 engine on GPT configs A and B, its MFU
// against the single-core GEMM ceiling measured in the same run, and the ratio
// to PyTorch (bench/torch_reference.py) on the same model and thread count.
//
//   train_throughput [steps=10] [warmup=2] [--no-torch] [--peak=GFLOPS] [--config=A|B]
// --peak skips the ceiling measurement and uses the given figure; --config runs one config.
//
// Config A: 4 layers, d_model 256, 4 heads, seq 128, batch 16.
// Config B: 8 layers, d_model 512, 8 heads, seq 256, batch 8.
//
// FLOPs per token = 6 * N (parameters without wpe: every weight is used in one
// forward and two backward products) + 12 * L * D * T (attention scores and
// their use, forward and backward, at full T; the causal mask is not credited).
//
// Two figures per run: wall-clock tokens/s and tokens per second of process CPU
// time (all threads, as the PyTorch script's time.process_time()). On a machine
// shared with other work the CPU-time figure is what one uncontended core
// gives; on an idle machine both agree. The PyTorch script reports the same
// pair, so the ratio compares like with like. PyTorch's OpenBLAS kernel follows
// the caller's OPENBLAS_CORETYPE (README, Performance). The GEMM ceiling is timed the
// same way (bench/gemm_timing.hpp).
//
// The speed of a core on a shared host drifts by 20 % and more within seconds,
// so a ceiling measured once at the start is a poor denominator for steps timed
// a minute later. Each timed step is therefore bracketed by two short samples
// of the ceiling's own shape and backend, and "paired MFU" is the median over
// steps of step FLOP/s over the mean of its two samples. On a steady machine it
// equals the plain figure.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/gemm_timing.hpp"
#include "core/spec.hpp"
#include "kernels/cpu/kernels.hpp"
#include "worker/engine.hpp"

namespace {

// Length of each ceiling sample around a timed step.
constexpr double kProbeSeconds = 0.05;

struct GptConfig {
  const char* name;
  int layers, d_model, heads, seq_len, batch;
};

struct Rates {
  double wall = 0.0, cpu = 0.0;  // tokens/s
};

std::string spec_yaml(const GptConfig& c, int steps) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "name: throughput-%s\n"
                "model:\n  type: gpt\n  vocab_size: 256\n  seq_len: %d\n  d_model: %d\n  n_layers: %d\n"
                "  n_heads: %d\n"
                "data:\n  source: synthetic\n"
                "train:\n  steps: %d\n  global_batch: %d\n  optimizer:\n    type: adamw\n    lr: 3e-4\n"
                "    weight_decay: 0.1\n  lr_schedule: constant\n  seed: 0\n"
                "resources:\n  device: cpu\n",
                c.name, c.seq_len, c.d_model, c.layers, c.heads, steps, c.batch);
  return buf;
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The interpreter for torch_reference.py: $TROUPE_PYTHON, else the system
// python3 (where Debian's python3-torch lives), else python3 on PATH.
std::string python() {
  if (const char* env = std::getenv("TROUPE_PYTHON")) return env;
  if (FILE* f = std::fopen("/usr/bin/python3", "r")) {
    std::fclose(f);
    return "/usr/bin/python3";
  }
  return "python3";
}

// Runs torch_reference.py for the same config; returns {0,0} when python3 or
// torch is missing.
Rates torch_rates(const GptConfig& c, int steps, int warmup) {
  char cmd[1024];
  std::snprintf(cmd, sizeof cmd,
                "%s %s/bench/torch_reference.py --layers %d --d-model %d --heads %d --seq-len %d "
                "--batch %d --steps %d --warmup %d --threads 1 2>/dev/null",
                python().c_str(), TROUPE_SOURCE_DIR, c.layers, c.d_model, c.heads, c.seq_len, c.batch, steps,
                warmup);
  Rates r;
  FILE* p = popen(cmd, "r");
  if (p == nullptr) return r;
  char line[1024];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    if (std::strncmp(line, "tokens_per_s=", 13) == 0) {
      std::sscanf(line, "tokens_per_s=%lf tokens_per_cpu_s=%lf", &r.wall, &r.cpu);
    }
  }
  pclose(p);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 10, warmup = 2;
  bool run_torch = true;
  double peak = 0.0;
  std::unique_ptr<troupe::bench::PeakProbe> probe;
  std::string only;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-torch") == 0)
      run_torch = false;
    else if (std::strncmp(argv[i], "--peak=", 7) == 0)
      peak = std::atof(argv[i] + 7);
    else if (std::strncmp(argv[i], "--config=", 9) == 0)
      only = argv[i] + 9;
    else
      pos.push_back(argv[i]);
  }
  if (pos.size() > 0) steps = std::max(1, std::atoi(pos[0].c_str()));
  if (pos.size() > 1) warmup = std::max(0, std::atoi(pos[1].c_str()));

  std::printf("gemm backend: %s\n", troupe::kernels::cpu::gemm_backend());
  if (peak <= 0.0) {
    std::printf("measuring the single-core GEMM ceiling...\n");
    std::fflush(stdout);
    const troupe::bench::Peak p = troupe::bench::measure_peak(3);
    peak = p.gflops;
    probe = std::make_unique<troupe::bench::PeakProbe>(p);
    std::printf("peak_gflops=%.1f (best median over backends and shapes, thread CPU time: %s, %s)\n\n", peak,
                troupe::kernels::cpu::gemm_backend_name(p.backend), p.shape.name.c_str());
  } else {
    std::printf("peak_gflops=%.1f (given)\n\n", peak);
  }

  const GptConfig configs[] = {{"A", 4, 256, 4, 128, 16}, {"B", 8, 512, 8, 256, 8}};
  for (const GptConfig& c : configs) {
    if (!only.empty() && only != c.name) continue;
    const troupe::JobSpec spec = troupe::parse_spec(spec_yaml(c, steps + warmup), "<train_throughput>");
    troupe::Engine engine(spec, troupe::EngineAssignment{});
    const int64_t n_params = engine.num_params();
    const int64_t n_no_wpe = n_params - int64_t(c.seq_len) * c.d_model;
    const double flops_per_token = 6.0 * double(n_no_wpe) + 12.0 * c.layers * c.d_model * double(c.seq_len);
    const double tokens = double(c.batch) * c.seq_len;

    for (int i = 0; i < warmup; ++i) engine.step();
    std::vector<double> wall, cpu, paired, samples;
    double loss = 0.0;
    double before = probe ? probe->sample(kProbeSeconds) : 0.0;
    for (int i = 0; i < steps; ++i) {
      const double c0 = process_cpu_seconds();
      const auto w0 = std::chrono::steady_clock::now();
      loss = engine.step().loss;
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
      cpu.push_back(process_cpu_seconds() - c0);
      if (probe) {
        const double after = probe->sample(kProbeSeconds);
        samples.push_back(after);
        paired.push_back(tokens * flops_per_token * 1e-9 / cpu.back() / (0.5 * (before + after)));
        before = after;
      }
    }
    const Rates ours{tokens / median(wall), tokens / median(cpu)};
    const double mfu_wall = ours.wall * flops_per_token * 1e-9 / peak;
    const double mfu_cpu = ours.cpu * flops_per_token * 1e-9 / peak;
    std::printf("config %s: L=%d D=%d H=%d T=%d B=%d params=%lld (no wpe %lld) flops/token=%.3g loss=%.3f\n",
                c.name, c.layers, c.d_model, c.heads, c.seq_len, c.batch, static_cast<long long>(n_params),
                static_cast<long long>(n_no_wpe), flops_per_token, loss);
    std::printf("  troupe   tokens/s wall=%.0f cpu=%.0f   MFU wall=%.1f%% cpu=%.1f%%\n", ours.wall, ours.cpu,
                100 * mfu_wall, 100 * mfu_cpu);
    if (probe)
      std::printf(
          "  paired   MFU cpu=%.1f%% (median over steps; ceiling sampled before and after each: "
          "median %.1f GFLOP/s)\n",
          100 * median(paired), median(samples));
    if (run_torch) {
      const double p0 = probe ? probe->sample(kProbeSeconds) : 0.0;
      const Rates t = torch_rates(c, std::max(3, steps / 2), std::max(1, warmup));
      const double p1 = probe ? probe->sample(kProbeSeconds) : 0.0;
      if (t.cpu > 0) {
        std::printf("  pytorch  tokens/s wall=%.0f cpu=%.0f   ratio troupe/pytorch wall=%.2f cpu=%.2f\n",
                    t.wall, t.cpu, ours.wall / t.wall, ours.cpu / t.cpu);
        // Both sides as a fraction of the ceiling measured next to them.
        if (probe) {
          const double torch_mfu = t.cpu * flops_per_token * 1e-9 / (0.5 * (p0 + p1));
          std::printf("  pytorch  paired MFU cpu=%.1f%%   paired ratio troupe/pytorch=%.2f\n",
                      100 * torch_mfu, median(paired) / torch_mfu);
        }
      } else
        std::printf("  pytorch  not available (python3 with torch)\n");
    }
    std::printf("config_%s tokens_per_s=%.1f tokens_per_cpu_s=%.1f mfu=%.4f mfu_cpu=%.4f mfu_paired=%.4f\n",
                c.name, ours.wall, ours.cpu, mfu_wall, mfu_cpu, probe ? median(paired) : 0.0);
    std::fflush(stdout);
  }
  return 0;
}
