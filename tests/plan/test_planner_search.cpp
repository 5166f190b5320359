// The planner prices the fused attention (no s x s term), plans chunks that do not divide the
// layers, and accounts for every candidate it counts: ranked, or rejected with a reason.
#include <catch2/catch.hpp>
#include <set>

#include "plan/cost_model.hpp"
#include "plan/plan.hpp"
#include "plan/planner.hpp"

using namespace troupe;
using namespace troupe::plan;

namespace {

Workload gpt(int layers, int64_t batch, int seq = 32) {
  Workload w;
  w.model = {ModelType::gpt, layers, 64, 256, seq};
  w.model.n_heads = 4;
  w.global_batch = batch;
  return w;
}

// The 2024-class Llama: 126 layers, d_model 16384, 128 heads, 8 key/value heads, ffn 53248,
// vocabulary 128256, sequence 8192, on 64 x 16 x 8 H100s in bf16 with ZeRO-1 and sequence
// parallelism, 2048 sequences a step.
PlanRequest llama_405b(ScheduleKind schedule) {
  PlanRequest r;
  Workload& w = r.work;
  w.model = {ModelType::llama, 126, 16384, 128256, 8192};
  w.model.n_heads = 128;
  w.model.n_kv_heads = 8;
  w.model.ffn_hidden = 53248;
  w.model.tie_embeddings = false;
  w.global_batch = 2048;
  w.compute = DType::bf16;
  w.zero = 1;
  w.schedule = schedule;
  w.sequence_parallel = true;
  w.engine = EngineKind::megatron;
  w.device = DeviceKind::cuda;
  r.devices = 8192;
  r.data = 64;
  r.pipeline = 16;
  r.tensor = 8;
  return r;
}

// Every candidate is ranked (a plan that fits) or rejected with a reason, and none twice.
void check_accounted(const PlanResult& res) {
  INFO(res.candidates << " candidates, " << res.ranked() << " ranked, " << res.rejected.size()
                      << " rejected");
  CHECK(res.candidates == res.ranked() + res.rejected.size());
  std::set<std::string> seen;
  for (const Estimate& e : res.plans)
    if (e.fits) CHECK(seen.insert(e.candidate.str()).second);
  size_t unfit = 0;
  for (const Rejected& x : res.rejected) {
    CHECK(!x.reason.empty());
    CHECK(x.candidate.rfind(x.layout.str() + " ", 0) == 0);
    CHECK(seen.insert(x.candidate).second);
    unfit += x.memory;
  }
  size_t priced_unfit = 0;
  for (const Estimate& e : res.plans) priced_unfit += !e.fits;
  CHECK(unfit == priced_unfit);
}

}  // namespace

TEST_CASE("cost model: the fused attention's FLOPs and bytes, worked by hand", "[plan][cost][attention]") {
  ModelShape m{ModelType::gpt, 2, 256, 256, 128};
  m.n_heads = 4;  // head size 64
  // Query blocks of 64 rows against the keys up to each block's last row: 64 x 64 + 64 x 128.
  CHECK(causal_fraction(128) == Approx((64.0 * 64 + 64.0 * 128) / (128.0 * 128)));
  CHECK(causal_fraction(64) == 1.0);
  CHECK(causal_fraction(8192) == Approx(0.5 + 32.0 / 8192));
  const AttentionFlops f = attention_flops(m, 2, 2);
  const double unit = 2.0 * 2 * (4 / 2) * 64 * 128.0 * 128 * causal_fraction(128);
  CHECK(f.forward == Approx(2 * unit));   // S = q k^T, O = P v
  CHECK(f.backward == Approx(5 * unit));  // S again, dV, dP, dQ, dK
  CHECK(attention_lse_bytes(m, 2, 2) == 4.0 * 2 * 2 * 128);
  m.type = ModelType::mlp;
  CHECK(attention_flops(m, 2, 1).forward == 0);
}

TEST_CASE("cost model: activations grow linearly in the sequence, no s x s term anywhere",
          "[plan][cost][attention]") {
  for (ModelType type : {ModelType::gpt, ModelType::llama})
    for (EngineKind engine : {EngineKind::troupe, EngineKind::megatron})
      for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
        for (DType dt : {DType::f32, DType::bf16}) {
          Workload w = gpt(4, 8, 256);
          w.model.type = type;
          w.model.n_kv_heads = type == ModelType::llama ? 2 : 0;
          w.engine = engine;
          w.compute = dt;
          Workload twice = w;
          twice.model.seq_len = 512;
          INFO(int(type) << " " << int(engine) << " " << to_string(rc) << " " << dtype_name(dt));
          // Per block: every kept tensor is (tokens, width) or (rows, heads, seq).
          CHECK(block_activation_bytes(twice, 2, 2, rc) == Approx(2 * block_activation_bytes(w, 2, 2, rc)));
          // A whole stage, workspace included (the logits and embeddings are per token too).
          const LayerRange all{0, 4, true, true};
          CHECK(stage_activation_bytes(twice, all, 3, 2, 2, rc, false) ==
                Approx(2 * stage_activation_bytes(w, all, 3, 2, 2, rc, false)));
          // Selective recomputation keeps what none does.
          CHECK(stage_activation_bytes(w, all, 3, 2, 2, Recompute::selective, false) ==
                stage_activation_bytes(w, all, 3, 2, 2, Recompute::none, false));
          // The materialised attention it replaces grew faster.
          Workload mat = w, mat2 = twice;
          mat.attention = mat2.attention = AttentionKind::materialized;
          if (rc == Recompute::none)
            CHECK(block_activation_bytes(mat2, 2, 2, rc) > 2.5 * block_activation_bytes(mat, 2, 2, rc));
        }
  // troupe's engine under bf16 keeps q|k|v and the output in 16 bits, the log-sum-exp in f32.
  Workload w = gpt(4, 8, 128);
  const double N = 2.0 * 128, D = 64, H = 4 * D;
  const double f32 = block_activation_bytes(w, 2, 1, Recompute::none);
  CHECK(f32 == Approx((N * D * 4 + 2 * N * 4) + N * 3 * D * 4 + 4.0 * 2 * 4 * 128 + N * D * 4 + N * D * 4 +
                      (N * D * 4 + 2 * N * 4) + N * H * 4 + N * H * 4));
  w.compute = DType::bf16;
  const double bf16 = block_activation_bytes(w, 2, 1, Recompute::none);
  CHECK(bf16 == Approx((N * D * 2 + 2 * N * 4) + N * 3 * D * 2 + 4.0 * 2 * 4 * 128 + N * D * 2 + N * D * 4 +
                       (N * D * 2 + 2 * N * 4) + N * H * 4 + N * H * 2));
}

TEST_CASE("cost model: the GPU accounting says it assumes a flash-style attention",
          "[plan][cost][attention]") {
  Workload w = gpt(4, 8);
  w.engine = EngineKind::megatron;
  CHECK_THAT(attention_assumed(w), Catch::Contains("flash-style"));
  CHECK_THAT(attention_assumed(w), Catch::Contains("no s x s"));
  w.attention = AttentionKind::materialized;
  CHECK_THAT(attention_assumed(w), Catch::Contains("Megatron-LM ran it in 2021-22"));
  CHECK(std::string(to_string(AttentionKind::fused)) == "fused");
}

TEST_CASE("planner: auto recompute searches none and full, selective only with a materialised attention",
          "[plan][planner]") {
  PlanRequest r;
  r.work = gpt(4, 8);
  r.devices = 2;
  std::set<Recompute> modes;
  for (const Estimate& e : search(r, builtin_hardware("cpu")).plans) modes.insert(e.candidate.recompute);
  CHECK(modes == std::set<Recompute>{Recompute::none, Recompute::full});
  r.work.attention = AttentionKind::materialized;
  modes.clear();
  for (const Estimate& e : search(r, builtin_hardware("cpu")).plans) modes.insert(e.candidate.recompute);
  CHECK(modes.count(Recompute::selective) == 1);
  // Written in the spec, selective stays a valid plan (priced as none).
  r.work.attention = AttentionKind::fused;
  r.recompute = Recompute::selective;
  const PlanResult fixed = search(r, builtin_hardware("cpu"));
  REQUIRE(fixed.best());
  CHECK(fixed.best()->candidate.recompute == Recompute::selective);
}

TEST_CASE("partition: chunks that do not divide the layers, fewer where the embedding and head sit",
          "[plan][partition]") {
  // 9 GPT blocks in 8 chunks (pipeline 4 x 2 virtual): one chunk holds 2, not the first or last.
  const Partition p = partition_layers(4, 2, ModelShape{ModelType::gpt, 9, 64, 256, 32});
  REQUIRE(p.n_chunks() == 8);
  int covered = 0, two = 0;
  for (int k = 0; k < 8; ++k) {
    CHECK(p.chunks[size_t(k)].first == covered);
    covered = p.chunks[size_t(k)].last;
    CHECK(p.chunks[size_t(k)].n_blocks() >= 1);
    two += p.chunks[size_t(k)].n_blocks() == 2;
  }
  CHECK(covered == 9);
  CHECK(two == 1);
  CHECK(p.chunks.front().n_blocks() == 1);
  CHECK(p.chunks.back().n_blocks() == 1);
  // A head worth 1.5 blocks: 126 blocks in 64 chunks, the last chunk gets fewer than the middle.
  const Partition q = partition_layers(126, 16, 4, StageCosts{1.0, 0.05, 1.5});
  CHECK(q.chunks.back().n_blocks() < q.chunks[30].n_blocks());
  CHECK(q.chunks.front().n_blocks() <= q.chunks[30].n_blocks());
  CHECK(q.max_cost() <= 2.5 + 1e-9);
}

TEST_CASE("plan: an interleaved plan over chunks that do not divide the layers is checked and runs",
          "[plan][partition]") {
  PlanInputs in;
  in.model = {ModelType::gpt, 9, 64, 256, 32};
  in.global_batch = 8;
  in.micro_batch = 2;
  in.schedule = ScheduleKind::interleaved;
  for (auto [pp, v] : {std::pair{2, 3}, std::pair{4, 2}}) {
    in.virtual_stages = v;
    INFO("pipeline " << pp << " x " << v);
    check_fits(in, {1, pp, 1});
    const Plan pl = make_plan(in, {1, pp, 1});
    CHECK(pl.partition.n_chunks() == pp * v);
    CHECK(pl.table.ranks.size() == size_t(pp));  // the schedule was built and checked
    std::set<int> sizes;
    for (const auto& c : pl.partition.chunks) sizes.insert(c.n_blocks());
    CHECK(sizes.size() > 1);  // uneven
    // Shipped as boundaries, the same plan is rebuilt and checked again.
    const Plan again = make_plan(in, {1, pp, 1}, pl.micro_batch, pl.boundaries());
    CHECK(again.boundaries() == pl.boundaries());
  }
}

TEST_CASE("planner: searches virtual stages that do not divide the layers", "[plan][planner]") {
  PlanRequest r;
  r.work = gpt(9, 8);
  r.work.schedule = ScheduleKind::interleaved;
  r.devices = 4;
  r.pipeline = 4;
  const PlanResult res = search(r, builtin_hardware("cpu"));
  check_accounted(res);
  bool uneven = false;
  for (const Estimate& e : res.plans)
    uneven = uneven || (e.candidate.virtual_stages == 2 && e.candidate.layout.pp == 4);  // 9 layers, 8 chunks
  CHECK(uneven);
  for (const Rejected& x : res.rejected) CHECK(x.reason.find("do not divide into") == std::string::npos);
}

TEST_CASE("planner: every candidate it counts is ranked or rejected with its reason", "[plan][planner]") {
  PlanRequest tiny;
  tiny.work = gpt(4, 8);
  tiny.work.model.n_heads = 2;
  tiny.devices = 4;
  check_accounted(search(tiny, builtin_hardware("cpu")));
  // Three devices and a model that only two divide: the candidates of 3 are counted and rejected.
  tiny.devices = 3;
  tiny.work.model.n_layers = 2;
  const PlanResult fewer = search(tiny, builtin_hardware("cpu"));
  CHECK(fewer.devices == 2);
  check_accounted(fewer);
  bool three = false;
  for (const Rejected& x : fewer.rejected) three = three || x.layout.world() == 3;
  CHECK(three);
  // Nothing fits: every priced candidate is rejected for its memory.
  tiny.memory_limit = 1024;
  check_accounted(search(tiny, builtin_hardware("cpu")));
  // GPT-3 175B on 64 A100s with every degree open.
  PlanRequest big;
  big.work.model = {ModelType::gpt, 96, 12288, 51200, 2048};
  big.work.model.n_heads = 96;
  big.work.global_batch = 64;
  big.work.compute = DType::bf16;
  big.work.schedule = ScheduleKind::interleaved;
  big.work.engine = EngineKind::megatron;
  big.work.device = DeviceKind::cuda;
  big.devices = 64;
  check_accounted(search(big, builtin_hardware("a100-80gb")));
}

TEST_CASE("planner: the 126-layer Llama on 8192 H100s interleaves, without full-square attention",
          "[plan][planner]") {
  const HardwareProfile h100 = builtin_hardware("h100-sxm");
  const PlanResult one = search(llama_405b(ScheduleKind::one_f_one_b), h100);
  check_accounted(one);
  // 6 micro-batch sizes x {none, full}.
  CHECK(one.candidates == 12);
  const PlanResult il = search(llama_405b(ScheduleKind::interleaved), h100);
  check_accounted(il);
  CHECK(il.candidates == 72);  // virtual stages 2..7 x 6 micro-batch sizes x {none, full}
  REQUIRE(il.fastest());
  CHECK(il.fastest()->schedule == ScheduleKind::interleaved);
  CHECK(il.fastest()->time.step < one.fastest()->time.step);
  // 126 layers in 16 x v chunks: the embedding's and the head's chunks hold fewer.
  const std::vector<int>& b = il.fastest()->boundaries;
  REQUIRE(b.size() >= 3);
  const int first = b[1] - b[0], last = b[b.size() - 1] - b[b.size() - 2], middle = b[2] - b[1];
  CHECK(first <= middle);
  CHECK(last < middle);
  // Without recomputation a pipeline rank needs about 89 GiB (it was 719 with the s x s scores).
  for (const Estimate& e : one.plans)
    if (e.candidate.recompute == Recompute::none && e.candidate.micro_batch == 1)
      CHECK(e.memory.total < 100.0 * (1ull << 30));
  PlanRequest mat = llama_405b(ScheduleKind::one_f_one_b);
  mat.work.attention = AttentionKind::materialized;
  mat.recompute = Recompute::none;
  mat.micro_batch = 1;
  const PlanResult scores = search(mat, h100);
  REQUIRE(!scores.plans.empty());
  CHECK(scores.plans.front().memory.total > 500.0 * (1ull << 30));
}
