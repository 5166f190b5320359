// Pipeline bubble: measured vs theoretical vs simulated.
//
//   pipeline_bubble [--steps 5] [--layers 8] [--d-model 64] [--seq 32] [--micro-batch 4]
//
// For pipeline 2 and 4, micro-batches 4/8/16, schedules 1F1B, interleaved
// (2 virtual stages) and zero-bubble ZB-H1 (backward split into B and W), runs the PipelineExecutor with the
// ranks as threads over the local backend on a small GPT and prints, per configuration:
//   theory     GPipe/1F1B (p-1)/(m+p-1); interleaved (p-1)/(v*m+p-1);
//              ZB-H1 (p-1)/(3m+p-1) (F = B = W)
//   simulated  check_schedule's bubble: the table's exact idle fraction with
//              t_B = 2 t_F (t_W = t_F of it under ZB-H1), equal chunks and free
//              communication (noise-free)
//   measured   mean over ranks of (step - compute) / step, median over steps;
//              a barrier separates steps, as the optimizer would
//   imbal      slowest / mean chunk cost of the partition (head and embedding
//              counted): extra bubble the equal-stage theory does not see
// The ranks are threads sharing this machine's cores: with more ranks than
// cores, busy ranks time-share and the measured figure is not a bubble alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "core/rng.hpp"
#include "parallel/pipeline.hpp"
#include "plan/partition.hpp"
#include "plan/schedule.hpp"

using namespace troupe;
using namespace troupe::parallel;
using namespace troupe::plan;

namespace {

struct Args {
  int steps = 5, layers = 8, d_model = 64, seq = 32, micro_batch = 4;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--steps")
      a.steps = v;
    else if (k == "--layers")
      a.layers = v;
    else if (k == "--d-model")
      a.d_model = v;
    else if (k == "--seq")
      a.seq = v;
    else if (k == "--micro-batch")
      a.micro_batch = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Measured {
  double bubble = 0.0;   // median over steps of the mean over ranks
  double step_ms = 0.0;  // median step time (slowest rank)
  double comm_ms = 0.0;  // median over steps of the mean over ranks
};

Measured run(const model::ModelConfig& cfg, const plan::Schedule& s, const Args& a) {
  const int pp = s.pp, m = s.m, B = a.micro_batch, T = a.seq;
  auto world = comm::make_local_world(pp);
  // [step][rank]
  std::vector<std::vector<PipelineTiming>> timing(a.steps + 1, std::vector<PipelineTiming>(pp));
  std::vector<std::exception_ptr> errors(pp);
  // Micro-batch data, shared read-only by the ranks.
  std::vector<std::vector<int32_t>> tokens(m), targets(m);
  for (int mb = 0; mb < m; ++mb) {
    rng::Stream st(7, mb);
    tokens[mb].resize(B * T);
    targets[mb].resize(B * T);
    for (auto& t : tokens[mb]) t = static_cast<int32_t>(st.below(256));
    for (auto& t : targets[mb]) t = static_cast<int32_t>(st.below(256));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < pp; ++r)
    threads.emplace_back([&, r] {
      try {
        comm::CommConfig cc;
        cc.backend = "local";
        cc.rank = r;
        cc.size = pp;
        cc.local_world = world;
        auto comm = comm::make_communicator(cc);
        Partition part = partition_layers(pp, s.v, shape_of(cfg));
        auto owned = make_rank_stages(cfg, part, r, check_schedule(s), B);
        std::vector<model::Stage*> stages;
        for (auto& st : owned) stages.push_back(st.get());
        PipelineExecutor ex(s, r, stages, comm.get(), B, T);
        auto data = [&](int mb) { return MicroBatch{tokens[mb].data(), targets[mb].data()}; };
        for (int step = 0; step <= a.steps; ++step) {  // step 0 is the warm-up
          comm->barrier();
          timing[step][r] = ex.run(data, 1.0f / (m * B * T)).timing;
          for (auto* st : stages) st->zero_grads();
        }
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<double> bubble, step_ms, comm_ms;
  for (int step = 1; step <= a.steps; ++step) {
    double b = 0.0, c = 0.0, slowest = 0.0;
    for (const auto& t : timing[step]) {
      b += t.bubble_ms / t.step_ms;
      c += t.comm_ms;
      slowest = std::max(slowest, t.step_ms);
    }
    bubble.push_back(b / pp);
    comm_ms.push_back(c / pp);
    step_ms.push_back(slowest);
  }
  return {median(bubble), median(step_ms), median(comm_ms)};
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  model::ModelConfig cfg;
  cfg.vocab_size = 256;
  cfg.d_model = a.d_model;
  cfg.seq_len = a.seq;
  cfg.n_layer = a.layers;
  cfg.n_head = 4;
  cfg.seed = 1;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf(
      "pipeline bubble: GPT V=256 D=%d T=%d L=%d, micro-batch %d, %d timed steps (median) after 1 warm-up\n",
      a.d_model, a.seq, a.layers, a.micro_batch, a.steps);
  std::printf(
      "ranks are threads over the local backend sharing %u hardware threads%s\n", cores,
      cores < 4 ? ": pipeline 4 time-shares the cores, so its measured bubble is not comparable" : "");
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    double l1 = 0.0;
    if (std::fscanf(f, "%lf", &l1) == 1)
      std::printf("load average %.1f on %u hardware threads: other processes take cores from the ranks too\n",
                  l1, cores);
    std::fclose(f);
  }
  std::printf(
      "theory: 1f1b (p-1)/(m+p-1), interleaved (p-1)/(v*m+p-1), zb-h1 (p-1)/(3m+p-1); simulated: checker, "
      "t_B = 2 t_F (zb-h1: B = W = t_F)\n\n");
  std::printf("%-12s %3s %2s %3s %8s %10s %9s %7s %9s %8s\n", "schedule", "pp", "v", "m", "theory",
              "simulated", "measured", "imbal", "step ms", "comm ms");
  for (int pp : {2, 4})
    for (ScheduleKind kind : {ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zb_h1})
      for (int m : {4, 8, 16}) {
        const int v = kind == ScheduleKind::interleaved ? 2 : 1;
        if (a.layers < pp * v) continue;
        plan::Schedule s = make_schedule(kind, pp, v, m);
        const CheckResult chk = check_schedule(s);
        Partition part = partition_layers(pp, v, shape_of(cfg));
        double mean = 0.0;
        for (double c : part.cost) mean += c / part.n_chunks();
        const Measured got = run(cfg, s, a);
        std::printf("%-12s %3d %2d %3d %7.1f%% %9.1f%% %8.1f%% %7.2f %9.1f %8.1f\n", schedule_name(kind), pp,
                    v, m, 100 * theoretical_bubble(kind, pp, v, m), 100 * chk.bubble, 100 * got.bubble,
                    part.max_cost() / mean, got.step_ms, got.comm_ms);
        std::fflush(stdout);
      }
  return 0;
}
