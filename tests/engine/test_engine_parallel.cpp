// Several ranks of one job as threads over the `local` communicator: every layout
// trains the 1x1x1 model, step for step.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <thread>

#include "core/spec.hpp"
#include "model/from_spec.hpp"
#include "model/stage.hpp"
#include "tests/support/local_ranks.hpp"
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
  const std::vector<std::string> errors = testing::run_ranks(world, [&](int r) {
    EngineAssignment a = testing::local_assignment(r, dp, pp, tp, local_world);
    a.comm_timeout = std::chrono::milliseconds(60000);
    Engine e(spec, a);
    while (!e.done()) {
      StepReport rep = e.step();
      losses[size_t(r)].push_back(rep.loss);
      if (rep.val_loss) vals[size_t(r)].push_back(*rep.val_loss);
    }
  });
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

TEST_CASE("engine: activation recomputation, full or selective, gives the same losses, bit for bit",
          "[engine][parallel][recompute]") {
  for (Recompute mode : {Recompute::full, Recompute::selective})
    for (const char* par : {"", "parallel: {pipeline: 2, tensor: 2, schedule: 1f1b}\n",
                            "parallel: {pipeline: 2, schedule: zb-h1}\n"}) {
      const bool pipelined = std::string(par).size() > 0;
      if (mode == Recompute::full && std::string(par).find("zb-h1") != std::string::npos)
        continue;  // refused
      const bool zb = std::string(par).find("zb-h1") != std::string::npos;
      INFO(to_string(mode) << " " << (zb ? "1x2x1 zb-h1" : pipelined ? "1x2x2" : "1x1x1"));
      JobSpec off = spec_for(2, par);
      JobSpec on = off;
      on.train.recompute = mode;
      std::vector<double> a, b, va, vb;
      if (zb) {
        a = run_layout(off, 1, 2, 1, &va);
        b = run_layout(on, 1, 2, 1, &vb);
      } else if (pipelined) {
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

TEST_CASE("stage: backward reports each flat-gradient range once it is final, tail first",
          "[engine][overlap]") {
  const model::ModelConfig cfg = model::model_config(spec_for(2));
  const int B = 2, T = cfg.seq_len, N = B * T;
  std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) {
    tokens[size_t(i)] = (i * 7 + 3) % cfg.vocab_size;
    targets[size_t(i)] = (i * 5 + 1) % cfg.vocab_size;
  }
  // A full stage (wte written by the head and again by the embedding) and a head-only
  // stage (the tied wte last in its buffer).
  for (LayerRange range : {LayerRange::full(cfg.n_layer), LayerRange{2, cfg.n_layer, false, true}}) {
    INFO("stage has_embedding " << range.has_embedding);
    model::Stage st(cfg, range, 1, B);
    std::vector<float> x(static_cast<size_t>(N) * cfg.d_model);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * float(int(i % 13) - 6);
    const float* x_in = range.has_embedding ? nullptr : x.data();
    const int32_t* tok = range.has_embedding ? tokens.data() : nullptr;
    st.zero_grads();
    st.forward(0, tok, x_in, targets.data(), B, T);
    st.backward(0, nullptr, 1.0f / N);  // a first micro-batch accumulates
    st.forward(0, tok, x_in, targets.data(), B, T);
    const float* g = st.store().flat_grads().f32();
    const size_t n = size_t(st.store().flat_grads().numel());
    std::vector<std::pair<size_t, size_t>> ranges;
    std::vector<std::vector<float>> seen;
    st.backward(0, nullptr, 1.0f / N, [&](size_t first, size_t end) {
      ranges.emplace_back(first, end);
      seen.emplace_back(g + first, g + end);
    });
    REQUIRE(ranges.size() == size_t(range.n_blocks()) + (range.has_embedding ? 2 : 1));
    size_t expect_end = n;
    for (size_t k = 0; k < ranges.size(); ++k) {
      INFO("range " << k);
      CHECK(ranges[k].second == expect_end);
      CHECK(ranges[k].first < ranges[k].second);
      expect_end = ranges[k].first;
      // What the callback saw is what the whole backward leaves there.
      CHECK(std::equal(seen[k].begin(), seen[k].end(), g + ranges[k].first));
    }
    CHECK(expect_end == 0);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += std::abs(g[i]);
    CHECK(sum > 0.0);
  }
}

TEST_CASE("engine: the overlapped data-parallel reduction gives the post-backward losses, bit for bit",
          "[engine][parallel][overlap]") {
  struct Layout {
    int dp, tp, micro_batch;
    const char* bucket_floats;  // small buckets: many per stage, cut across parameters and blocks
  };
  for (Layout l :
       {Layout{2, 1, 2, "4096"}, Layout{4, 1, 2, "1000"}, Layout{2, 2, 4, "777"}, Layout{2, 1, 1, ""}}) {
    INFO("layout " << l.dp << "x1x" << l.tp << " micro_batch " << l.micro_batch << " bucket "
                   << l.bucket_floats);
    if (*l.bucket_floats)
      setenv("TROUPE_DP_BUCKET_FLOATS", l.bucket_floats, 1);
    else
      unsetenv("TROUPE_DP_BUCKET_FLOATS");
    const JobSpec spec = spec_for(l.micro_batch, "parallel: {data: " + std::to_string(l.dp) +
                                                     ", tensor: " + std::to_string(l.tp) + "}\n");
    setenv("TROUPE_DP_OVERLAP", "0", 1);
    std::vector<double> post_val, overlap_val;
    const std::vector<double> post = run_layout(spec, l.dp, 1, l.tp, &post_val);
    unsetenv("TROUPE_DP_OVERLAP");
    const std::vector<double> overlapped = run_layout(spec, l.dp, 1, l.tp, &overlap_val);
    REQUIRE(post.size() == 6);
    CHECK(overlapped == post);
    CHECK(overlap_val == post_val);
  }
  unsetenv("TROUPE_DP_BUCKET_FLOATS");
}

TEST_CASE("engine: errors of the overlapped reduction reach step(), request_abort releases it",
          "[engine][parallel][overlap]") {
  const JobSpec spec = spec_for(2, "parallel: {data: 2}\n");
  for (bool peer_aborts : {false, true}) {
    INFO((peer_aborts ? "the peer aborts" : "this rank aborts"));
    auto local_world = comm::make_local_world(2);
    std::vector<std::unique_ptr<Engine>> engines(2);
    std::vector<std::thread> build;
    for (int r = 0; r < 2; ++r)
      build.emplace_back([&, r] {
        EngineAssignment a;
        a.rank = r;
        a.layout = {2, 1, 1};
        a.comm.backend = "local";
        a.comm.local_world = local_world;
        // Far past the test's own timeout: only an abort ends the wait for the absent peer.
        a.comm_timeout = std::chrono::hours(1);
        engines[size_t(r)] = std::make_unique<Engine>(spec, a);
      });
    for (auto& t : build) t.join();
    REQUIRE(engines[0]);
    REQUIRE(engines[1]);
    // Rank 1 never steps: rank 0's backward completes and its buckets wait for the peer.
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      engines[peer_aborts ? 1 : 0]->request_abort();
    });
    std::string what;
    bool aborted = false, comm_error = false;
    try {
      engines[0]->step();
    } catch (const EngineAborted&) {
      aborted = true;
    } catch (const comm::CommError& e) {
      comm_error = true;
      what = e.what();
    }
    aborter.join();
    CHECK(aborted == !peer_aborts);
    CHECK(comm_error == peer_aborts);
    if (peer_aborts) CHECK(what.find("allreduce") != std::string::npos);
    CHECK(engines[0]->next_step() == 0);
  }
}
