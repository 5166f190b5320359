// Checkpoint figures: write throughput of a synchronous save against `dd ... conv=fsync`
// of the same size on the same disk, and the step-time overhead of saving every k steps,
// synchronously and asynchronously, against training without checkpoints.
//
//   ckpt_bench [--dir DIR] [--layers 4] [--d-model 256] [--heads 4] [--seq 128] [--batch 16]
//              [--steps 20] [--every 5]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "core/spec.hpp"
#include "worker/engine.hpp"

using namespace troupe;
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

namespace {

double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

JobSpec make_spec(int layers, int d, int heads, int seq, int batch, int steps, bool async) {
  return parse_spec("name: bench\nmodel: {type: gpt, seq_len: " + std::to_string(seq) +
                        ", d_model: " + std::to_string(d) + ", n_layers: " + std::to_string(layers) +
                        ", n_heads: " + std::to_string(heads) +
                        "}\ndata: {source: synthetic}\ntrain: {steps: " + std::to_string(steps) +
                        ", global_batch: " + std::to_string(batch) +
                        ", seed: 1}\ncheckpoint: {keep: 2, async: " + (async ? "true" : "false") + "}\n",
                    "bench.yaml");
}

// Seconds for `steps` steps, saving every `every` steps (0 = never) into dir; the last
// asynchronous write is waited for inside the timed region.
double train_seconds(const JobSpec& spec, int every, const std::string& dir) {
  Engine e(spec, {});
  e.step();  // warm-up outside the timed region
  const auto t0 = clk::now();
  while (!e.done()) {
    e.step();
    if (every > 0 && e.next_step() % every == 0) e.save_checkpoint(dir);
  }
  if (every > 0) e.wait_checkpoint();
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = fs::temp_directory_path() / ("troupe_ckpt_bench_" + std::to_string(::getpid()));
  int layers = 4, d = 256, heads = 4, seq = 128, batch = 16, steps = 20, every = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--dir")
      dir = v;
    else if (k == "--layers")
      layers = std::stoi(v);
    else if (k == "--d-model")
      d = std::stoi(v);
    else if (k == "--heads")
      heads = std::stoi(v);
    else if (k == "--seq")
      seq = std::stoi(v);
    else if (k == "--batch")
      batch = std::stoi(v);
    else if (k == "--steps")
      steps = std::stoi(v);
    else if (k == "--every")
      every = std::stoi(v);
  }
  fs::create_directories(dir);

  // 1. Write throughput: three synchronous saves of the same state, best of three.
  JobSpec sync = make_spec(layers, d, heads, seq, batch, steps, false);
  Engine e(sync, {});
  e.step();
  double best = 1e30;
  uint64_t bytes = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = clk::now();
    const std::string ck = e.save_checkpoint(dir + "/write");
    best = std::min(best, seconds_since(t0));
    bytes = 0;
    for (const auto& f : checkpoint::verify(ck).files) bytes += f.size;
  }
  const uint64_t mib = (bytes + (1 << 20) - 1) >> 20;
  const std::string dd =
      "dd if=/dev/zero of=" + dir + "/dd.bin bs=1M count=" + std::to_string(mib) + " conv=fsync status=none";
  double dd_best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = clk::now();
    if (std::system(dd.c_str()) != 0) {
      std::fprintf(stderr, "ckpt_bench: %s failed\n", dd.c_str());
      return 1;
    }
    dd_best = std::min(dd_best, seconds_since(t0));
    fs::remove(dir + "/dd.bin");
  }
  std::printf("model: %d layers, d_model %d, %d heads, seq %d, batch %d: %lld parameters\n", layers, d, heads,
              seq, batch, static_cast<long long>(e.num_params()));
  std::printf("checkpoint size: %.1f MiB (parameters + AdamW m and v, one shard)\n",
              double(bytes) / (1 << 20));
  std::printf("write (snapshot + safetensors + fsync + xxh64 + commit), best of 3: %.3f s = %.2f GB/s\n",
              best, double(bytes) / best / 1e9);
  std::printf("dd bs=1M count=%llu conv=fsync, best of 3:                         %.3f s = %.2f GB/s\n",
              static_cast<unsigned long long>(mib), dd_best, double(mib << 20) / dd_best / 1e9);
  std::printf("checkpoint / dd: %.0f %%\n", 100.0 * (double(bytes) / best) / (double(mib << 20) / dd_best));

  // 2. Step-time overhead of saving every `every` steps.
  // The three modes interleaved, best of three each, so a busy machine hurts all alike.
  double none = 1e30, with_sync = 1e30, with_async = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    none = std::min(none,
                    train_seconds(make_spec(layers, d, heads, seq, batch, steps, false), 0, dir + "/none"));
    with_sync = std::min(with_sync, train_seconds(make_spec(layers, d, heads, seq, batch, steps, false),
                                                  every, dir + "/sync"));
    with_async = std::min(with_async, train_seconds(make_spec(layers, d, heads, seq, batch, steps, true),
                                                    every, dir + "/async"));
  }
  const int timed = steps - 1;
  std::printf("%d steps, checkpoint every %d steps (%d saves), best of 3 interleaved runs\n", timed, every,
              steps / every);
  std::printf("  no checkpoints:   %.3f s (%.1f ms/step)\n", none, 1e3 * none / timed);
  std::printf("  synchronous:      %.3f s (%.1f ms/step), overhead %+.1f %%\n", with_sync,
              1e3 * with_sync / timed, 100.0 * (with_sync - none) / none);
  std::printf("  asynchronous:     %.3f s (%.1f ms/step), overhead %+.1f %%\n", with_async,
              1e3 * with_async / timed, 100.0 * (with_async - none) / none);
  fs::remove_all(dir);
  return 0;
}
