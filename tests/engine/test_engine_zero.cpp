// ZeRO stages and the zero-bubble schedule through the engine, ranks as threads over the
// `local` communicator: both change where state lives and when work runs, never what is
// computed, so every run follows the one it replaces.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "core/spec.hpp"
#include "tests/support/local_ranks.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

const char* kGpt = "{type: gpt, seq_len: 16, d_model: 32, n_layers: 4, n_heads: 4}";

JobSpec spec_for(int zero, const std::string& parallel, int64_t steps = 20, int micro_batch = 2,
                 const std::string& model = kGpt) {
  return parse_spec("name: z\nmodel: " + model + "\n" +
                        "data: {source: synthetic}\n"
                        "train: {steps: " +
                        std::to_string(steps) + ", global_batch: 8, micro_batch: " +
                        std::to_string(micro_batch) + ", seed: 3, zero: " + std::to_string(zero) +
                        ", optimizer: {lr: 0.003}, grad_clip: 0.5, eval_every: 10}\n" + parallel,
                    "z.yaml");
}

std::string parallel_of(Layout l, const std::string& schedule = "1f1b") {
  return "parallel: {data: " + std::to_string(l.dp) + ", pipeline: " + std::to_string(l.pp) +
         ", tensor: " + std::to_string(l.tp) + ", schedule: " + schedule + "}\n";
}

// Rank 0's losses (every rank reports the global loss) after checking every rank ran.
std::vector<double> losses_of(const testing::LayoutRun& run) {
  for (size_t r = 0; r < run.errors.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(run.errors[r] == "");
  }
  std::vector<double> out;
  for (const StepReport& s : run.reports[0]) out.push_back(s.loss);
  return out;
}

void require_close(const std::vector<double>& got, const std::vector<double>& ref, double eps) {
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO("step " << i);
    CHECK(got[i] == Approx(ref[i]).epsilon(eps));
  }
}

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("troupe_zero_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

}  // namespace

TEST_CASE("engine: ZeRO 1 and 2 give the ZeRO 0 losses for 20 steps at dp 2 and 4, with pipeline and tensor",
          "[engine][zero]") {
  struct Case {
    Layout l;
    const char* schedule;
  };
  for (Case c : {Case{{2, 1, 1}, "1f1b"}, Case{{4, 1, 1}, "1f1b"}, Case{{2, 2, 1}, "1f1b"},
                 Case{{2, 1, 2}, "1f1b"}, Case{{2, 2, 2}, "1f1b"}, Case{{2, 2, 1}, "interleaved"}}) {
    const Layout l = c.l;
    INFO("layout " << l.str() << " " << c.schedule);
    // Interleaved: two chunks per rank, each with its own flat buffers and partition.
    const std::string par =
        std::string(c.schedule) == "interleaved"
            ? "parallel: {data: 2, pipeline: 2, schedule: interleaved, virtual_stages: 2}\n"
            : parallel_of(l);
    const std::vector<double> ref = losses_of(testing::run_layout(spec_for(0, par), l, "", 20));
    REQUIRE(ref.size() == 20);
    for (int zero : {1, 2}) {
      INFO("zero " << zero);
      require_close(losses_of(testing::run_layout(spec_for(zero, par), l, "", 20)), ref, 1e-5);
    }
  }
}

TEST_CASE("engine: a checkpoint of one ZeRO stage resumes under another stage and layout", "[engine][zero]") {
  const std::string dir = temp_dir("resume");
  const Layout l4{4, 1, 1}, l2{2, 1, 1}, l22{2, 2, 1};
  const std::vector<double> ref = losses_of(testing::run_layout(spec_for(0, parallel_of(l4)), l4, "", 20));
  // ZeRO 2 at dp 4 saves at step 10 (each rank its share of the whole moments, gathered
  // from their owners) ...
  testing::LayoutRun first = testing::run_layout(spec_for(2, parallel_of(l4)), l4, "", 10, dir + "/z2");
  losses_of(first);
  const std::string ckpt = checkpoint::resolve(dir + "/z2");
  // ... the same stage and layout continue bit for bit ...
  const std::vector<double> same = losses_of(testing::run_layout(spec_for(2, parallel_of(l4)), l4, ckpt, 20));
  const std::vector<double> uninterrupted =
      losses_of(testing::run_layout(spec_for(2, parallel_of(l4)), l4, "", 20));
  REQUIRE(same.size() == 10);
  for (size_t i = 0; i < same.size(); ++i) CHECK(same[i] == uninterrupted[10 + i]);
  // ... and ZeRO 0, 1 and 2 on other layouts follow the ZeRO 0 curve from it.
  struct Case {
    int zero;
    Layout l;
  };
  for (Case c : {Case{0, l2}, Case{1, l2}, Case{2, l22}, Case{1, Layout{1, 1, 1}}}) {
    INFO("zero " << c.zero << " on " << c.l.str());
    const std::vector<double> got =
        losses_of(testing::run_layout(spec_for(c.zero, parallel_of(c.l)), c.l, ckpt, 20));
    require_close(got, std::vector<double>(ref.begin() + 10, ref.end()), 1e-5);
  }
  // A ZeRO 0 checkpoint loads into ZeRO 2 as well.
  testing::run_layout(spec_for(0, parallel_of(l2)), l2, "", 10, dir + "/z0");
  require_close(
      losses_of(testing::run_layout(spec_for(2, parallel_of(l4)), l4, checkpoint::resolve(dir + "/z0"), 20)),
      std::vector<double>(ref.begin() + 10, ref.end()), 1e-5);
  fs::remove_all(dir);
}

TEST_CASE("engine: the zb-h1 schedule gives the 1f1b losses for 20 steps under pipeline 2 and 4",
          "[engine][zb]") {
  for (Layout l : {Layout{1, 2, 1}, Layout{1, 4, 1}, Layout{2, 2, 1}, Layout{1, 2, 2}}) {
    INFO("layout " << l.str());
    // micro-batch 1: 8 micro-batches per step (4 with data 2), more than the pipeline's depth.
    const std::vector<double> ref =
        losses_of(testing::run_layout(spec_for(0, parallel_of(l, "1f1b"), 20, 1), l, "", 20));
    const std::vector<double> zb =
        losses_of(testing::run_layout(spec_for(0, parallel_of(l, "zb-h1"), 20, 1), l, "", 20));
    require_close(zb, ref, 1e-6);
    // The weight gradients accumulate in micro-batch order, as 1F1B's do: the same bits.
    CHECK(zb == ref);
  }
  // A llama (grouped-query attention, SwiGLU, an untied head: the last stage's W includes lm_head's).
  const std::string llama =
      "{type: llama, seq_len: 16, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, ffn_hidden: 64}";
  for (Layout l : {Layout{1, 4, 1}, Layout{1, 2, 2}}) {
    INFO("llama " << l.str());
    CHECK(losses_of(testing::run_layout(spec_for(0, parallel_of(l, "zb-h1"), 20, 1, llama), l, "", 20)) ==
          losses_of(testing::run_layout(spec_for(0, parallel_of(l, "1f1b"), 20, 1, llama), l, "", 20)));
  }
  // With ZeRO 2 on top.
  const Layout l{2, 2, 1};
  require_close(losses_of(testing::run_layout(spec_for(2, parallel_of(l, "zb-h1"), 20, 1), l, "", 20)),
                losses_of(testing::run_layout(spec_for(0, parallel_of(l, "1f1b"), 20, 1), l, "", 20)), 1e-5);
}

TEST_CASE("engine: ZeRO 1 and 2 hold a 1/dp part of AdamW's moments, every parameter once",
          "[engine][zero]") {
  for (int dp : {2, 4}) {
    const Layout l{dp, 1, 1};
    for (int zero : {0, 1, 2}) {
      INFO("dp " << dp << " zero " << zero);
      const JobSpec spec = spec_for(zero, parallel_of(l), 1);
      auto world = comm::make_local_world(dp);
      std::vector<EngineMemory> mem(static_cast<size_t>(dp));
      std::vector<int64_t> params(static_cast<size_t>(dp));
      const std::vector<std::string> errors = testing::run_ranks(dp, [&](int r) {
        Engine e(spec, testing::local_assignment(r, dp, 1, 1, world));
        mem[size_t(r)] = e.memory();
        params[size_t(r)] = e.num_params();
      });
      int64_t moments = 0;
      for (int r = 0; r < dp; ++r) {
        REQUIRE(errors[size_t(r)] == "");
        CHECK(mem[size_t(r)].zero == zero);
        CHECK(mem[size_t(r)].params == mem[0].params);  // stages 1 and 2 keep whole parameters
        CHECK(mem[size_t(r)].grads == mem[0].grads);
        moments += mem[size_t(r)].optimizer;
      }
      const int64_t whole = 2 * params[0] * int64_t(sizeof(float));
      if (zero == 0) {
        for (const EngineMemory& m : mem) CHECK(m.optimizer == whole);
      } else {
        // The parts over the ranks cover every parameter float exactly once (padding excluded).
        CHECK(moments == whole);
        for (const EngineMemory& m : mem)
          CHECK(m.optimizer <= whole / dp + 2 * 64 * int64_t(sizeof(float)) * dp);
      }
    }
  }
}

TEST_CASE("engine: ZeRO 2 in bf16 and fp16 follows ZeRO 0 in the same precision", "[engine][zero]") {
  const Layout l{2, 1, 1};
  for (const char* precision : {"bf16", "fp16"}) {
    INFO(precision);
    auto spec = [&](int zero) {
      JobSpec s = spec_for(zero, parallel_of(l), 10);
      s.train.precision = std::string(precision) == "bf16" ? Precision::bf16 : Precision::fp16;
      return s;
    };
    const testing::LayoutRun ref = testing::run_layout(spec(0), l, "", 10);
    const testing::LayoutRun got = testing::run_layout(spec(2), l, "", 10);
    require_close(losses_of(got), losses_of(ref), 1e-5);
    for (size_t i = 0; i < ref.reports[0].size(); ++i) {
      CHECK(got.reports[0][i].skipped == ref.reports[0][i].skipped);
      CHECK(got.reports[0][i].loss_scale == ref.reports[0][i].loss_scale);
    }
  }
}
