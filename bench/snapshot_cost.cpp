// What in-memory snapshots (checkpoint.memory_every) cost a step: two engines of the same
// GPT config train side by side in this process, one taking a snapshot after every step and
// one taking none, their steps interleaved (off, on, off, on, ...) so that both see the same
// machine; the medians of their step times (process CPU time and wall time) and the ratio.
//
//   snapshot_cost [steps=20] [--config=A|B]
//
// Config A: 4 layers, d_model 256, 4 heads, seq 128, batch 16 (bench/train_throughput.cpp's).
// Config B: 8 layers, d_model 512, 8 heads, seq 256, batch 8.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench/step_timing.hpp"
#include "core/spec.hpp"
#include "worker/engine.hpp"
#include "worker/memory_snapshot.hpp"

namespace {

struct Config {
  const char* name;
  int layers, d_model, heads, seq_len, batch;
};
constexpr Config kA{"A", 4, 256, 4, 128, 16};
constexpr Config kB{"B", 8, 512, 8, 256, 8};

std::string spec_yaml(const Config& c, int steps) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "name: snapshot-%s\n"
                "model:\n  type: gpt\n  vocab_size: 256\n  seq_len: %d\n  d_model: %d\n  n_layers: %d\n"
                "  n_heads: %d\n"
                "data:\n  source: synthetic\n"
                "train:\n  steps: %d\n  global_batch: %d\n  seed: 0\n"
                "checkpoint:\n  memory_every: 1\n"
                "resources:\n  device: cpu\n",
                c.name, c.seq_len, c.d_model, c.layers, c.heads, steps, c.batch);
  return buf;
}

using troupe::bench::median;
using troupe::bench::process_cpu_seconds;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  Config c = kA;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--config=B") == 0)
      c = kB;
    else if (std::strcmp(argv[i], "--config=A") == 0)
      c = kA;
    else if (std::atoi(argv[i]) > 0)
      steps = std::atoi(argv[i]);
    else {
      std::fprintf(stderr, "usage: snapshot_cost [steps=20] [--config=A|B]\n");
      return 2;
    }
  }
  const troupe::JobSpec spec = troupe::parse_spec(spec_yaml(c, steps + 2), "<snapshot_cost>");
  troupe::MemorySnapshots store;
  troupe::EngineAssignment with;
  with.snapshots = &store;
  troupe::Engine off(spec, troupe::EngineAssignment{}), on(spec, with);
  std::printf("snapshot_cost: config %s (%d layers, d_model %d, seq %d, batch %d), %d steps each, on %s\n",
              c.name, c.layers, c.d_model, c.seq_len, c.batch, steps, cpu_model().c_str());
  std::printf("memory: %s\n", troupe::to_string(on.memory()).c_str());
  off.step();  // warm-up: GEMM choices, allocations
  on.step();
  std::vector<double> cpu[2], wall[2];
  double loss[2] = {0, 0};
  for (int i = 0; i < 2 * steps; ++i) {
    const int k = i % 2;
    troupe::Engine& e = k ? on : off;
    const double c0 = process_cpu_seconds();
    const auto w0 = std::chrono::steady_clock::now();
    loss[k] = e.step().loss;
    wall[k].push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count());
    cpu[k].push_back(1000.0 * (process_cpu_seconds() - c0));
  }
  const auto held = store.held();
  std::printf("| snapshots | step ms (CPU) | step ms (wall) | last loss |\n|---|---:|---:|---:|\n");
  std::printf("| off | %.2f | %.2f | %.6f |\n", median(cpu[0]), median(wall[0]), loss[0]);
  std::printf("| every step (%.1f MiB held, newest of step %lld) | %.2f | %.2f | %.6f |\n",
              double(store.bytes()) / (1 << 20), held.empty() ? -1LL : (long long)held.front(),
              median(cpu[1]), median(wall[1]), loss[1]);
  std::printf("cost of a snapshot per step: %+.2f %% (CPU), %+.2f %% (wall)\n",
              100.0 * (median(cpu[1]) / median(cpu[0]) - 1.0),
              100.0 * (median(wall[1]) / median(wall[0]) - 1.0));
  return loss[0] == loss[1] ? 0 : 1;  // the same training either way
}
