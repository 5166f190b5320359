// Several ranks of one job as threads over the `local` communicator: every layout
// trains the 1x1x1 model, step for step.
#include <catch2/catch.hpp>
#include <thread>

#include "core/spec.hpp"
#include "worker/engine.hpp"

using namespace troupe;

namespace {

JobSpec spec_for(int micro_batch, const std::string& parallel = "") {
  return parse_spec(
      "name: p\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 4, n_heads: 4}\n"
      "data: {source: synthetic}\n"
      "train: {steps: 6, global_batch: 8, micro_batch: " +
          std::to_string(micro_batch) + ", seed: 5, optimizer: {lr: 0.003}, eval_every: 3}\n" + parallel,
      "p.yaml");
}

// Runs `steps` steps of the layout with ranks as threads; returns the loss per step
// as reported by rank 0 (every rank reports the same global loss).
std::vector<double> run_layout(const JobSpec& spec, int dp, int pp, int tp,
                               std::vector<double>* val = nullptr) {
  const int world = dp * pp * tp;
  auto local_world = comm::make_local_world(world);
  std::vector<std::vector<double>> losses(static_cast<size_t>(world)), vals(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        EngineAssignment a;
        a.rank = r;
        a.world = world;
        a.dp = dp;
        a.pp = pp;
        a.tp = tp;
        a.comm.backend = "local";
        a.comm.local_world = local_world;
        a.comm_timeout = std::chrono::milliseconds(60000);
        Engine e(spec, a);
        while (!e.done()) {
          StepReport rep = e.step();
          losses[size_t(r)].push_back(rep.loss);
          if (rep.val_loss) vals[size_t(r)].push_back(*rep.val_loss);
        }
      } catch (const std::exception& ex) {
        errors[size_t(r)] = ex.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[size_t(r)] == "");
    REQUIRE(losses[size_t(r)] == losses[0]);
    REQUIRE(vals[size_t(r)] == vals[0]);
  }
  if (val) *val = vals[0];
  return losses[0];
}

}  // namespace

TEST_CASE("engine: data parallelism gives the 1x1x1 losses", "[engine][parallel]") {
  const JobSpec spec = spec_for(2);
  Engine single(spec, {});
  std::vector<double> ref;
  while (!single.done()) ref.push_back(single.step().loss);
  for (int dp : {2, 4}) {
    INFO("dp " << dp);
    std::vector<double> got = run_layout(spec, dp, 1, 1);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == Approx(ref[i]).epsilon(1e-5));
  }
}

TEST_CASE("engine: every layout with data, pipeline, tensor in {1,2} gives the 1x1x1 losses",
          "[engine][parallel]") {
  const JobSpec base = spec_for(2);
  Engine single(base, {});
  std::vector<double> ref, ref_val;
  while (!single.done()) {
    StepReport r = single.step();
    ref.push_back(r.loss);
    if (r.val_loss) ref_val.push_back(*r.val_loss);
  }
  REQUIRE(ref_val.size() == 2);
  struct Layout {
    int dp, pp, tp;
    const char* schedule;
  };
  for (Layout l : {Layout{1, 1, 2, "1f1b"}, Layout{1, 2, 1, "gpipe"}, Layout{1, 2, 1, "1f1b"},
                   Layout{1, 2, 1, "interleaved"}, Layout{2, 2, 1, "1f1b"}, Layout{2, 1, 2, "1f1b"},
                   Layout{1, 2, 2, "1f1b"}, Layout{2, 2, 2, "1f1b"}}) {
    INFO("layout " << l.dp << "x" << l.pp << "x" << l.tp << " " << l.schedule);
    std::string par = "parallel: {data: " + std::to_string(l.dp) + ", pipeline: " + std::to_string(l.pp) +
                      ", tensor: " + std::to_string(l.tp) + ", schedule: " + l.schedule +
                      (std::string(l.schedule) == "interleaved" ? ", virtual_stages: 2" : "") + "}\n";
    const JobSpec spec = spec_for(2, par);
    std::vector<double> val;
    std::vector<double> got = run_layout(spec, l.dp, l.pp, l.tp, &val);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == Approx(ref[i]).epsilon(1e-4));
    REQUIRE(val.size() == ref_val.size());
    for (size_t i = 0; i < val.size(); ++i) CHECK(val[i] == Approx(ref_val[i]).epsilon(1e-4));
  }
}

TEST_CASE("engine: activation recomputation gives the same losses, bit for bit",
          "[engine][parallel][recompute]") {
  for (const char* par : {"", "parallel: {pipeline: 2, tensor: 2, schedule: 1f1b}\n"}) {
    const bool pipelined = std::string(par).size() > 0;
    INFO((pipelined ? "1x2x2" : "1x1x1"));
    JobSpec off = spec_for(2, par);
    JobSpec on = off;
    on.train.recompute = Recompute::block;
    std::vector<double> a, b, va, vb;
    if (pipelined) {
      a = run_layout(off, 1, 2, 2, &va);
      b = run_layout(on, 1, 2, 2, &vb);
    } else {
      a = run_layout(off, 1, 1, 1, &va);
      b = run_layout(on, 1, 1, 1, &vb);
    }
    REQUIRE(a.size() == 6);
    CHECK(a == b);
    CHECK(va == vb);
  }
}
