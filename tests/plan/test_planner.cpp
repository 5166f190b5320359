// The cost model and the planner: divisibility and fit rules, memory formulas against
// cases worked by hand, the simulated bubble against theory, and the planner's choices
// (the only layout that fits, a re-plan on fewer devices, a clear refusal).
#include <catch2/catch.hpp>
#include <cmath>

#include "core/error.hpp"
#include "plan/cost_model.hpp"
#include "plan/planner.hpp"

using namespace troupe;
using namespace troupe::plan;

namespace {

// A tiny GPT: 2 layers, d 64, 2 heads, vocab 256, seq 32, MLP 256.
Workload tiny_gpt(int64_t batch = 8) {
  Workload w;
  w.model = {ModelType::gpt, 2, 64, 256, 32};
  w.model.n_heads = 2;
  w.global_batch = batch;
  return w;
}

HardwareProfile cpu() { return builtin_hardware("cpu"); }

Candidate cand(int dp, int pp, int tp, int mb, Recompute r = Recompute::none, int v = 1) {
  return Candidate{{dp, pp, tp}, v, mb, r};
}

}  // namespace

TEST_CASE("cost model: parameter counts worked by hand", "[plan][cost]") {
  const Workload w = tiny_gpt();
  // GPT block: ln_1, ln_2 (4D), c_attn (3D^2 + 3D), c_proj (D^2 + D), c_fc (FD + F), mlp c_proj (DF + D).
  const double D = 64, F = 256;
  CHECK(block_params(w.model, 1) == 4 * D * D + 2 * F * D + 9 * D + F);  // 49984
  CHECK(block_params(w.model, 1) == 49984);
  // Tensor shard of 2: the column-parallel weights and biases and the row-parallel weights halve;
  // the norms and the row-parallel biases (6D) stay whole.
  CHECK(block_params(w.model, 2) == (4 * D * D + 2 * F * D + 3 * D + F) / 2 + 6 * D);  // 25184
  CHECK(embedding_params(w.model, 1) == 256 * 64 + 32 * 64);                           // wte + wpe
  CHECK(embedding_params(w.model, 2) == 256 * 64 + 32 * 64);                      // gpt: whole on every shard
  CHECK(head_params(w.model, 1, /*with_embedding=*/true) == 2 * 64);              // ln_f; the head reads wte
  CHECK(head_params(w.model, 1, /*with_embedding=*/false) == 2 * 64 + 256 * 64);  // + wte's tied copy
  CHECK(model_params(w.model) == 2 * 49984 + 18432 + 128);

  // A llama: q, k|v (2 kv heads of 16), o, gate|up, down; two RMSNorm weights; split by vocabulary.
  ModelShape l{ModelType::llama, 2, 64, 512, 32};
  l.n_heads = 4;
  l.n_kv_heads = 2;
  l.ffn_hidden = 192;
  l.tie_embeddings = false;
  CHECK(block_params(l, 1) == 2 * 64.0 * 64 + 2 * 32.0 * 64 + 3 * 192.0 * 64 + 2 * 64);
  CHECK(block_params(l, 2) == (2 * 64.0 * 64 + 2 * 32.0 * 64 + 3 * 192.0 * 64) / 2 + 2 * 64);
  CHECK(embedding_params(l, 2) == 512 * 64 / 2);
  CHECK(head_params(l, 2, true) == 64 + 512 * 64 / 2);  // untied: its own lm_head rows
}

TEST_CASE("cost model: Megatron-LM's activation formulas (Korthikanti et al. 2022, table 2)",
          "[plan][cost]") {
  // GPT-3 175B: s 2048, h 12288, a 96, b 1, t 8; 5as/h = 80. As those runs kept the scores.
  Workload w;
  w.model = {ModelType::gpt, 96, 12288, 51200, 2048};
  w.model.n_heads = 96;
  w.compute = DType::bf16;
  w.engine = EngineKind::megatron;
  w.attention = AttentionKind::materialized;
  const double sbh = 2048.0 * 12288;
  CHECK(block_activation_bytes(w, 1, 1, Recompute::none) == Approx(sbh * (34 + 80)));
  CHECK(block_activation_bytes(w, 1, 8, Recompute::none) == Approx(sbh * (10 + 24.0 / 8 + 80.0 / 8)));
  CHECK(block_activation_bytes(w, 1, 8, Recompute::selective) == Approx(sbh * (10 + 24.0 / 8)));
  CHECK(block_activation_bytes(w, 1, 8, Recompute::full) == Approx(sbh * 2));
  w.sequence_parallel = true;
  CHECK(block_activation_bytes(w, 1, 8, Recompute::none) == Approx(sbh * (34.0 / 8 + 80.0 / 8)));
  CHECK(block_activation_bytes(w, 1, 8, Recompute::selective) == Approx(sbh * 34.0 / 8));
  // A fused (flash-style) attention keeps no 5 a s^2 b: the 34 s b h and one f32 log-sum-exp per
  // query row and local head; selective recomputation then keeps the same.
  w.attention = AttentionKind::fused;
  w.sequence_parallel = false;
  const double lse8 = 4.0 * 96 / 8 * 2048;
  CHECK(block_activation_bytes(w, 1, 1, Recompute::none) == Approx(sbh * 34 + 4.0 * 96 * 2048));
  CHECK(block_activation_bytes(w, 1, 8, Recompute::none) == Approx(sbh * (10 + 24.0 / 8) + lse8));
  CHECK(block_activation_bytes(w, 1, 8, Recompute::selective) ==
        block_activation_bytes(w, 1, 8, Recompute::none));
  CHECK(block_activation_bytes(w, 1, 8, Recompute::full) == Approx(sbh * 2));
  w.sequence_parallel = true;
  CHECK(block_activation_bytes(w, 1, 8, Recompute::none) == Approx(sbh * 34.0 / 8 + lse8));
}

TEST_CASE("cost model: memory by precision and ZeRO stage, worked by hand", "[plan][cost]") {
  Workload w = tiny_gpt();
  const HardwareProfile hw = cpu();
  const double P = model_params(w.model);  // one rank holds the whole model at 2x1x1
  Estimate e = estimate(w, cand(2, 1, 1, 4), hw);
  CHECK(e.memory.params == P * 4);     // f32 masters
  CHECK(e.memory.grads == P * 4);      // f32 gradients
  CHECK(e.memory.optimizer == P * 8);  // AdamW m and v
  w.compute = DType::bf16;
  e = estimate(w, cand(2, 1, 1, 4), hw);
  CHECK(e.memory.params == P * 6);  // + the 16-bit copy the products read
  w.zero = 1;
  e = estimate(w, cand(2, 1, 1, 4), hw);
  CHECK(e.memory.optimizer == P * 8 / 2);  // moments of this rank's half
  CHECK(e.memory.grads == P * 4);
  w.zero = 2;
  e = estimate(w, cand(2, 1, 1, 4), hw);
  CHECK(e.memory.grads == P * 4 / 2 + std::min(P * 4, 16.0 * (1 << 20)));  // its parts + a bucket
  // Everything adds up, with the process and the allocator's slack.
  CHECK(e.memory.total == Approx(e.memory.params + e.memory.grads + e.memory.optimizer +
                                 e.memory.activations + e.memory.other));
  CHECK(e.memory.other ==
        Approx(double(hw.process_memory) + hw.allocator_slack * (e.memory.params + e.memory.grads +
                                                                 e.memory.optimizer + e.memory.activations)));
  // Megatron's accounting: 18 bytes per parameter, 6 + 12/dp with the distributed optimizer.
  Workload m = tiny_gpt();
  m.compute = DType::bf16;
  m.engine = EngineKind::megatron;
  e = estimate(m, cand(2, 1, 1, 4), hw);
  CHECK(e.memory.params + e.memory.grads + e.memory.optimizer == Approx(P * 18));
  m.zero = 1;
  e = estimate(m, cand(2, 1, 1, 4), hw);
  CHECK(e.memory.params + e.memory.grads + e.memory.optimizer == Approx(P * (6 + 12.0 / 2)));
}

TEST_CASE("cost model: recomputation and micro-batches trade activations for time", "[plan][cost]") {
  Workload w = tiny_gpt(16);
  const HardwareProfile hw = cpu();
  const Estimate none = estimate(w, cand(1, 1, 1, 16), hw);
  const Estimate full = estimate(w, cand(1, 1, 1, 16, Recompute::full), hw);
  const Estimate sel = estimate(w, cand(1, 1, 1, 16, Recompute::selective), hw);
  CHECK(full.memory.activations < none.memory.activations);
  CHECK(none.time.step < full.time.step);
  // The fused attention keeps no probabilities and recomputes them in its backward anyway:
  // selective recomputation is none, in memory and in time.
  CHECK(sel.memory.total == none.memory.total);
  CHECK(sel.time.step == none.time.step);
  // A materialised attention kept them: selective trades them for the attention's forward.
  w.attention = AttentionKind::materialized;
  const Estimate m_none = estimate(w, cand(1, 1, 1, 16), hw);
  const Estimate m_sel = estimate(w, cand(1, 1, 1, 16, Recompute::selective), hw);
  const Estimate m_full = estimate(w, cand(1, 1, 1, 16, Recompute::full), hw);
  CHECK(m_full.memory.activations < m_sel.memory.activations);
  CHECK(m_sel.memory.activations < m_none.memory.activations);
  CHECK(m_none.time.step < m_sel.time.step);
  CHECK(m_sel.time.step < m_full.time.step);
  CHECK(none.memory.activations < m_none.memory.activations);
  w.attention = AttentionKind::fused;
  // Smaller micro-batches hold fewer activations.
  const Estimate small = estimate(w, cand(1, 1, 1, 4), hw);
  CHECK(small.memory.activations < none.memory.activations);
  CHECK(small.n_micro == 4);
}

TEST_CASE("cost model: the simulated 1F1B bubble is (p-1)/(m+p-1) on balanced stages", "[plan][cost]") {
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const Simulator sim(one_f_one_b(p, m));
      CheckOptions o;
      o.chunk_forward.assign(p, std::vector<double>(1, 1.0));
      o.chunk_backward.assign(p, std::vector<double>(1, 2.0));
      const CheckResult r = sim.run(o);
      INFO("p " << p << " m " << m);
      CHECK(r.bubble == Approx(double(p - 1) / (m + p - 1)));
      CHECK(r.makespan == Approx(3.0 * (m + p - 1)));
    }
  // Interleaved, v chunks each a 1/v of the work: (p-1)/(v m + p-1).
  const Simulator sim(interleaved_1f1b(4, 2, 8));
  CheckOptions o;
  o.chunk_forward.assign(4, std::vector<double>(2, 0.5));
  o.chunk_backward.assign(4, std::vector<double>(2, 1.0));
  CHECK(sim.run(o).bubble == Approx(theoretical_bubble(ScheduleKind::interleaved, 4, 2, 8)));
  // A transfer time is not idle time: it is the rank's own, and the step grows by it.
  const CheckResult without = sim.run(o);
  o.t_transfer = 0.1;
  const CheckResult with = sim.run(o);
  CHECK(with.makespan > without.makespan);
  CHECK(with.transfer[0] > 0);
  for (int q = 0; q < 4; ++q) CHECK(with.busy[q] + with.transfer[q] <= with.makespan + 1e-9);
}

TEST_CASE("cost model: the pipeline's bubble comes out of the estimate", "[plan][cost]") {
  Workload w = tiny_gpt(16);
  const Estimate e = estimate(w, cand(1, 2, 1, 2), cpu());
  CHECK(e.n_micro == 8);
  CHECK(e.time.bubble_fraction > 0);
  CHECK(e.time.bubble_fraction < 0.5);
  CHECK(e.time.step > e.time.compute);
  // More micro-batches, a smaller bubble.
  const Estimate more = estimate(w, cand(1, 2, 1, 1), cpu());
  CHECK(more.time.bubble_fraction < e.time.bubble_fraction);
}

TEST_CASE("planner: divisibility rules name the degree and the number", "[plan][planner]") {
  const Workload w = tiny_gpt(8);
  CHECK(refusal(w, cand(3, 1, 1, 1)) == "global_batch (8) is not divisible by data (3)");
  CHECK(refusal(w, cand(2, 1, 1, 3)) == "global_batch / data (4) is not divisible by micro_batch (3)");
  CHECK(refusal(w, cand(1, 1, 4, 1)) == "n_heads (2) is not divisible by tensor (4)");
  CHECK_THAT(refusal(w, cand(1, 4, 1, 1)), Catch::Contains("2 layers cannot give each of 4"));
  Workload il = w;
  il.model.n_layers = 4;
  il.schedule = ScheduleKind::interleaved;
  CHECK(refusal(il, cand(1, 2, 1, 4, Recompute::none, 2)).empty());  // 2 micro-batches in groups of 2
  CHECK_THAT(refusal(il, cand(1, 2, 1, 8, Recompute::none, 2)),
             Catch::Contains("1 micro-batches per step do not divide"));
  // Chunks need not hold the same number of layers: 6 layers in 4 chunks are planned.
  il.model.n_layers = 6;
  CHECK(refusal(il, cand(1, 2, 1, 4, Recompute::none, 2)).empty());
  Workload l = w;
  l.model.type = ModelType::llama;
  l.model.n_heads = 4;
  l.model.n_kv_heads = 1;
  CHECK(refusal(l, cand(1, 1, 2, 1)) == "n_kv_heads (1) is not divisible by tensor (2)");
  l.model.n_kv_heads = 2;
  l.model.vocab_size = 255;
  CHECK(refusal(l, cand(1, 1, 2, 1)) == "vocab_size (255) is not divisible by tensor (2)");
  CHECK(refusal(w, cand(2, 1, 1, 2)).empty());
  CHECK_THROWS_WITH(estimate(w, cand(3, 1, 1, 1), cpu()), Catch::Contains("not divisible by data (3)"));
}

TEST_CASE("planner: searches every layout, micro-batch and recompute mode, fastest first",
          "[plan][planner]") {
  PlanRequest r;
  r.work = tiny_gpt(8);
  r.devices = 4;
  const PlanResult res = search(r, cpu());
  CHECK(res.devices == 4);
  // 4 = 4x1x1, 2x2x1, 2x1x2, 1x4x1 (2 layers: refused), 1x2x2, 1x1x4 (2 heads: refused).
  size_t layouts4 = 0;
  for (const auto& e : res.plans) {
    CHECK(e.candidate.layout.world() == 4);
    CHECK(refusal(r.work, e.candidate).empty());
    ++layouts4;
  }
  CHECK(layouts4 > 0);
  for (size_t i = 1; i < res.plans.size(); ++i)
    if (res.plans[i].fits && res.plans[i - 1].fits)
      CHECK(res.plans[i - 1].time.step <= res.plans[i].time.step);
  bool refused_pp4 = false, refused_tp4 = false;
  for (const auto& x : res.rejected) {
    refused_pp4 = refused_pp4 || (x.layout == Layout{1, 4, 1} && x.candidate.rfind("1x4x1 mb", 0) == 0 &&
                                  x.reason.find("cannot give each of 4") != std::string::npos);
    refused_tp4 =
        refused_tp4 || (x.layout == Layout{1, 1, 4} && x.reason.find("n_heads (2)") != std::string::npos);
  }
  CHECK(refused_pp4);
  CHECK(refused_tp4);
  REQUIRE(res.best() != nullptr);
  CHECK(res.best()->runnable.empty());
  CHECK_THAT(res.explain(cpu()), Catch::Contains("s/step predicted"));
  // What the spec fixes stays fixed.
  r.data = 2;
  r.micro_batch = 2;
  r.recompute = Recompute::full;
  const PlanResult fixed = search(r, cpu());
  for (const auto& e : fixed.plans) {
    CHECK(e.candidate.layout.dp == 2);
    CHECK(e.candidate.micro_batch == 2);
    CHECK(e.candidate.recompute == Recompute::full);
  }
}

TEST_CASE("planner: picks the only layout that fits", "[plan][planner]") {
  PlanRequest r;
  r.work = tiny_gpt(8);
  r.devices = 2;
  r.micro_batch = 4;
  r.recompute = Recompute::none;
  // Price the three 2-device layouts, then give each device just what the smallest needs.
  const HardwareProfile hw = cpu();
  double smallest = 1e300;
  Layout want;
  for (const Layout& L : {Layout{2, 1, 1}, Layout{1, 2, 1}, Layout{1, 1, 2}}) {
    const Estimate e = estimate(r.work, cand(L.dp, L.pp, L.tp, 4), hw);
    if (e.memory.total < smallest) {
      smallest = e.memory.total;
      want = L;
    }
  }
  r.memory_limit = smallest;
  const PlanResult res = search(r, hw);
  REQUIRE(res.best() != nullptr);
  CHECK(res.best()->candidate.layout == want);
  size_t fit = 0;
  for (const auto& e : res.plans) fit += e.fits;
  CHECK(fit == 1);
}

TEST_CASE("planner: a re-plan on fewer devices changes the layout", "[plan][planner]") {
  Workload w = tiny_gpt(8);
  w.model.n_layers = 3;
  PlanRequest r;
  r.work = w;
  r.devices = 4;
  const PlanResult four = search(r, cpu());
  REQUIRE(four.best());
  CHECK(four.best()->candidate.layout.world() == 4);
  // 3 devices: data 3 does not divide the batch, tensor 3 not the heads; a 3-stage pipeline does.
  r.devices = 3;
  const PlanResult three = search(r, cpu());
  REQUIRE(three.best());
  CHECK(three.best()->candidate.layout == Layout{1, 3, 1});
  // With 2 layers no layout of 3 devices divides the job: the planner uses 2.
  r.work.model.n_layers = 2;
  const PlanResult fewer = search(r, cpu());
  CHECK(fewer.devices == 2);
  REQUIRE(fewer.best());
  CHECK(fewer.best()->candidate.layout.world() == 2);
}

TEST_CASE("planner: nothing fits: says the smallest memory that would", "[plan][planner]") {
  PlanRequest r;
  r.work = tiny_gpt(8);
  r.devices = 2;
  r.memory_limit = 1024;  // 1 KiB per device
  const PlanResult res = search(r, cpu());
  CHECK(res.best() == nullptr);
  const std::string why = res.explain(cpu());
  CHECK_THAT(why, Catch::Contains("nothing fits in"));
  CHECK_THAT(why, Catch::Contains("the smallest plan"));
  CHECK_THAT(why, Catch::Contains("GiB"));
  // The smallest is the smallest of the candidates.
  double smallest = 1e300;
  for (const auto& e : res.plans) smallest = std::min(smallest, e.memory.total);
  char buf[64];
  std::snprintf(buf, sizeof buf, "needs %.2f GiB", smallest / double(1ull << 30));
  CHECK_THAT(why, Catch::Contains(buf));
  for (const auto& x : res.rejected)
    if (x.reason.rfind("needs ", 0) == 0) CHECK_THAT(x.reason, Catch::Contains("available"));
}

TEST_CASE("planner: thousands of candidates for a cluster-sized model", "[plan][planner]") {
  // GPT-3 175B on 64 A100s, every degree, micro-batch, recompute mode and interleaving left open.
  PlanRequest r;
  r.work.model = {ModelType::gpt, 96, 12288, 51200, 2048};
  r.work.model.n_heads = 96;
  r.work.global_batch = 64;
  r.work.compute = DType::bf16;
  r.work.schedule = ScheduleKind::interleaved;
  r.work.engine = EngineKind::megatron;
  r.work.device = DeviceKind::cuda;
  r.devices = 64;
  const HardwareProfile hw = builtin_hardware("a100-80gb");
  const PlanResult res = search(r, hw);
  CHECK(res.candidates > 1000);
  REQUIRE(res.fastest() != nullptr);
  CHECK(res.best() == nullptr);  // troupe does not run it on GPUs yet
  CHECK_THAT(res.fastest()->runnable, Catch::Contains("GPUs over data parallelism only"));
  // Megatron-LM's own layout for it (tensor 8 within a node, pipeline 8) is among those that fit,
  // and the fastest keeps tensor parallelism inside a node.
  bool megatron = false;
  for (const auto& e : res.plans) megatron = megatron || (e.fits && e.candidate.layout == Layout{1, 8, 8});
  CHECK(megatron);
  CHECK(res.fastest()->candidate.layout.tp <= hw.devices_per_node);
}

TEST_CASE("planner: resolve writes the choice into the spec", "[plan][planner]") {
  JobSpec s;
  s.parallel.data = 0;
  s.parallel.pipeline = 0;
  s.parallel.tensor = 0;
  s.train.micro_batch = 0;
  s.train.recompute = Recompute::auto_;
  s.parallel.schedule = troupe::Schedule::interleaved;
  s.parallel.virtual_stages = 0;
  CHECK(has_auto(s));
  const JobSpec a = resolve(s, Candidate{{1, 2, 2}, 3, 4, Recompute::full});
  CHECK(!has_auto(a));
  CHECK(layout_of(a.parallel) == Layout{1, 2, 2});
  CHECK(a.parallel.virtual_stages == 3);
  CHECK(a.train.micro_batch == 4);
  CHECK(a.train.recompute == Recompute::full);
  // One stage: nothing to interleave.
  const JobSpec b = resolve(s, Candidate{{4, 1, 1}, 1, 2, Recompute::none});
  CHECK(b.parallel.schedule == troupe::Schedule::one_f_one_b);
  CHECK(b.parallel.virtual_stages == 1);
}
