#include "plan/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "plan/cost_internal.hpp"
#include "plan/plan.hpp"

namespace troupe::plan {

using namespace detail;

Workload workload(const JobSpec& spec) {
  Workload w;
  w.model = model_shape(spec);
  w.global_batch = spec.train.global_batch;
  w.compute = compute_dtype(spec.train.precision);
  w.zero = spec.train.zero;
  w.schedule = schedule_kind(spec.parallel.schedule);
  w.sequence_parallel = spec.parallel.sequence_parallel;
  w.device = spec.resources.device;
  w.memory_snapshots = spec.checkpoint.memory_every > 0 && w.device == DeviceKind::cpu &&
                       spec.train.offload == Offload::none;  // (the engine takes none under offload)
  w.spread = spec.resources.placement == troupe::Placement::spread;
  // troupe's engine trains on the CPU; a GPU job is priced as Megatron-LM runs it (16-bit
  // activations) with a fused flash-style attention, the design the GPU engine follows.
  w.engine = w.device == DeviceKind::cuda ? EngineKind::megatron : EngineKind::troupe;
  return w;
}

const char* to_string(AttentionKind k) { return k == AttentionKind::materialized ? "materialized" : "fused"; }

std::string Candidate::str() const {
  std::string s = layout.str();
  if (virtual_stages > 1) s += " v" + std::to_string(virtual_stages);
  s += " mb" + std::to_string(micro_batch) + " " + to_string(recompute);
  return s;
}

// ---------------------------------------------------------------- refusal

namespace {

std::string divides(int64_t n, int by, const std::string& what, const std::string& degree) {
  if (by > 0 && n % by == 0) return "";
  return what + " (" + std::to_string(n) + ") is not divisible by " + degree + " (" + std::to_string(by) +
         ")";
}

}  // namespace

std::string refusal(const Workload& w, const Candidate& c) {
  const ModelShape& m = w.model;
  const Layout& L = c.layout;
  if (L.dp < 1 || L.pp < 1 || L.tp < 1 || c.micro_batch < 1 || c.virtual_stages < 1)
    return "a degree below 1";
  if (std::string why = divides(w.global_batch, L.dp, "global_batch", "data"); !why.empty()) return why;
  const int64_t rows = w.global_batch / L.dp;
  if (rows % c.micro_batch != 0)
    return "global_batch / data (" + std::to_string(rows) + ") is not divisible by micro_batch (" +
           std::to_string(c.micro_batch) + ")";
  const int64_t n_micro = rows / c.micro_batch;
  if (L.tp > 1) {
    if (m.type != ModelType::mlp)
      if (std::string why = divides(m.heads(), L.tp, "n_heads", "tensor"); !why.empty()) return why;
    if (std::string why = divides(m.d_model, L.tp, "d_model", "tensor"); !why.empty()) return why;
    if (std::string why = divides(m.ffn(), L.tp, "ffn_hidden", "tensor"); !why.empty()) return why;
    if (is_llama(m)) {
      if (std::string why = divides(m.kv_heads(), L.tp, "n_kv_heads", "tensor"); !why.empty()) return why;
      if (std::string why = divides(m.vocab_size, L.tp, "vocab_size", "tensor"); !why.empty()) return why;
    }
    if (w.sequence_parallel)
      if (std::string why = divides(m.seq_len, L.tp, "seq_len", "tensor (sequence parallelism)");
          !why.empty())
        return why;
  }
  const ScheduleKind kind = c.virtual_stages > 1 ? ScheduleKind::interleaved : w.schedule;
  if (int64_t(L.pp) * c.virtual_stages > m.n_layers)
    return std::to_string(m.n_layers) + " layers cannot give each of " +
           std::to_string(L.pp * c.virtual_stages) + " pipeline chunks a block";
  if (L.pp > 1 && kind == ScheduleKind::interleaved) {
    if (c.virtual_stages < 2) return "the interleaved schedule needs virtual_stages >= 2";
    if (n_micro % L.pp != 0)
      return "interleaving runs micro-batches in groups of pipeline (" + std::to_string(L.pp) +
             "): " + std::to_string(n_micro) + " micro-batches per step do not divide";
  }
  if (c.virtual_stages > 1 && L.pp == 1) return "virtual stages need a pipeline";
  if (c.recompute != Recompute::none && c.recompute != Recompute::selective && c.recompute != Recompute::full)
    return "recompute must be none, selective or full";
  return "";
}

// ---------------------------------------------------------------- the estimate

namespace {

// What troupe's engine cannot run today, "" when it can.
std::string not_runnable(const Workload& w, const Candidate& c, ScheduleKind kind,
                         const HardwareProfile& hw) {
  if (hw.device == ProfileDevice::ipu) return "troupe has no IPU backend: the plan is priced, not run";
  if (w.device == DeviceKind::cuda && (c.layout.pp > 1 || c.layout.tp > 1))
    return "troupe's engine trains GPUs over data parallelism only: its pipeline and tensor groups on GPUs "
           "are not built yet";
  if (w.device == DeviceKind::cuda && w.zero > 0) return "troupe's engine runs ZeRO on CPUs only";
  if (w.engine != EngineKind::troupe) return "priced as Megatron-LM runs it, not troupe's engine";
  if (w.sequence_parallel && c.layout.tp > 1) return "sequence parallelism is not implemented in the engine";
  if (w.zero == 3) return "ZeRO 3 is not implemented in the engine";
  if (kind == ScheduleKind::zb_h1 && c.layout.pp > 1 && c.recompute == Recompute::full)
    return "zb-h1 keeps every block's activations for W: no full recomputation with it";
  return "";
}

}  // namespace

const Simulator& ScheduleCache::simulator(ScheduleKind kind, int pp, int v, int m) {
  auto& sim = sims_[std::make_tuple(int(kind), pp, v, m)];
  if (!sim) sim = std::make_unique<Simulator>(make_schedule(kind, pp, v, m));
  return *sim;
}

const std::vector<int>& ScheduleCache::slots(ScheduleKind kind, int pp, int v, int m) {
  auto& sl = slots_[std::make_tuple(int(kind), pp, v, m)];
  if (sl.empty()) {
    // A rank's live micro-batches follow from its own table's order, not from durations.
    const CheckResult r = simulator(kind, pp, v, m).run({});
    for (int p = 0; p < pp; ++p)
      for (int c = 0; c < v; ++c) sl.push_back(activation_slots(r, pp, p, c));
  }
  return sl;
}

Workload priced_workload(const Workload& w, const HardwareProfile& hw) {
  Workload p = w;
  // An IPU's frameworks keep 16-bit activations and a flash-style attention, as Megatron-LM does
  // on GPUs: its accounting, whatever device the spec names.
  if (hw.device == ProfileDevice::ipu) p.engine = EngineKind::megatron;
  return p;
}

Estimate estimate(const Workload& spec_work, const Candidate& c, const HardwareProfile& hw,
                  const EstimateOptions& o) {
  const Workload w = priced_workload(spec_work, hw);
  if (std::string why = refusal(w, c); !why.empty()) throw Error("candidate " + c.str() + ": " + why);
  ScheduleCache local;
  ScheduleCache& cache = o.cache ? *o.cache : local;
  const ModelShape& m = w.model;
  const Layout& L = c.layout;
  Estimate est;
  est.candidate = c;
  est.sequence_parallel = w.sequence_parallel && L.tp > 1;
  est.n_micro = int(w.global_batch / L.dp / c.micro_batch);
  est.schedule =
      L.pp > 1 ? (c.virtual_stages > 1 ? ScheduleKind::interleaved : w.schedule) : ScheduleKind::one_f_one_b;
  est.runnable = not_runnable(w, c, est.schedule, hw);
  const int v = L.pp > 1 ? c.virtual_stages : 1;
  const Placement place{L, std::max(1, hw.devices_per_node)};
  ChunkCoster cost(w, c, hw, place);
  const EngineBytes eb = engine_bytes(w);

  // Chunk boundaries, balanced by this model's own costs.
  const Partition part = partition_layers(m.n_layers, L.pp, v, cost.stage_costs());
  for (const auto& ch : part.chunks) est.boundaries.push_back(ch.first);
  est.boundaries.push_back(m.n_layers);
  std::vector<double> rank_params(L.pp, 0.0);
  for (int p = 0; p < L.pp; ++p)
    for (int ci = 0; ci < v; ++ci) {
      const LayerRange& r = part.of(p, ci);
      rank_params[p] += r.n_blocks() * block_params(m, L.tp) +
                        (r.has_embedding ? embedding_params(m, L.tp, w.engine) : 0) +
                        (r.has_head ? head_params(m, L.tp, r.has_embedding, w.engine) : 0);
    }
  // Peak in-flight micro-batches per [p][chunk]: the schedule's (1 without a pipeline).
  const std::vector<int> one(size_t(L.pp) * v, 1);
  const std::vector<int>& slots = L.pp > 1 ? cache.slots(est.schedule, L.pp, v, est.n_micro) : one;

  // ---- memory, per pipeline rank; the largest
  const double cb = eb.kept;
  const double N = double(c.micro_batch) * m.seq_len, D = m.d_model;
  std::vector<MemoryEstimate> mems(L.pp);
  std::vector<RankBytes> held(L.pp);
  for (int p = 0; p < L.pp; ++p) {
    MemoryEstimate mem;
    mem.pipeline_rank = p;
    const double P = rank_params[p];
    if (w.engine == EngineKind::megatron) {
      // 16-bit weights, fp32 main gradients, fp32 master + Adam m and v (distributed
      // optimizer: sharded over the data-parallel group).
      mem.params = P * cb;
      mem.grads = P * 4;
      mem.optimizer = P * 12 / (w.zero >= 1 ? L.dp : 1);
      if (w.zero >= 2) mem.grads = P * 4 / L.dp;
      if (w.zero >= 3) mem.params = P * cb / L.dp + 2 * block_params(m, L.tp) * cb;  // + two gathered blocks
    } else {
      mem.params = P * (4 + (w.compute != DType::f32 ? 2 : 0));
      mem.grads = P * 4;
      mem.optimizer = P * 8 / (w.zero >= 1 ? L.dp : 1);
      // ZeRO 2 without a pipeline: this rank's parts, and the bucket being reduced.
      if (w.zero >= 2 && L.pp == 1) mem.grads = P * 4 / L.dp + std::min(P * 4, 16.0 * (1 << 20));
      if (w.zero >= 3)  // this rank's part, and two blocks gathered at a time
        mem.params = mem.params / L.dp + 2 * block_params(m, L.tp) * (4 + (w.compute != DType::f32 ? 2 : 0));
      // Two snapshots of its own and, with more than one rank, two copies of its buddy
      // partner's (counted as large as its own); none when data-parallel replicas hold the
      // same state (train.zero 0: the coordinator gives such a job no buddies), nor when the
      // job is packed onto one node (the buddy maps its partner's snapshots there:
      // worker/snapshot_segment.hpp); spread, its buddies sit on other nodes.
      const bool copies =
          L.world() > 1 && !(w.zero == 0 && L.dp > 1) && (w.spread || L.world() > place.per_node);
      if (w.memory_snapshots) mem.snapshots = (copies ? 4 : 2) * (P * 4 + mem.optimizer);
    }
    double act = 0, act_one = 0;  // all in flight; one micro-batch through every chunk
    bool recomputes = false;
    for (int ci = 0; ci < v; ++ci) {
      const LayerRange& r = part.of(p, ci);
      const int n_slots = slots[size_t(p) * v + ci];
      if (w.engine == EngineKind::megatron) {
        const double blocks = r.n_blocks() * block_activation_bytes(w, c.micro_batch, L.tp, c.recompute);
        // The embedding's dropout mask (its output is the first block's input, counted there).
        const double embed = r.has_embedding ? N * D / (est.sequence_parallel ? L.tp : 1) : 0.0;
        const double logits = r.has_head ? N * m.vocab_size / L.tp * 4 : 0.0;  // fp32, for the loss
        act += n_slots * (blocks + embed) + logits;
        act_one += blocks + embed + logits;
        recomputes = recomputes || (c.recompute == Recompute::full && r.n_blocks() > 0);
        continue;
      }
      const bool split = est.schedule == ScheduleKind::zb_h1 && L.pp > 1;
      act += stage_activation_bytes(w, r, n_slots, c.micro_batch, L.tp, c.recompute, split);
      act_one += stage_activation_bytes(w, r, 1, c.micro_batch, L.tp, c.recompute, split);
    }
    // Under full recomputation a rank rebuilds one block's activations at a time.
    if (recomputes) act += block_activation_bytes(w, c.micro_batch, L.tp, Recompute::none);
    mem.activations = act;
    const double model_bytes = mem.params + mem.grads + mem.optimizer + mem.activations;
    mem.other = double(hw.process_memory) + model_bytes * hw.allocator_slack;
    mem.total = model_bytes + mem.other + mem.snapshots;
    RankBytes& h = held[p];
    h.params = mem.params;
    h.grads = mem.grads;
    h.optimizer = mem.optimizer;
    h.activations = mem.activations;
    h.total = mem.total;
    h.act_one = act_one;
    h.n_micro = est.n_micro;
    h.passes = c.recompute == Recompute::full ? 3 : 2;
    h.slack = hw.allocator_slack;
    const double block = block_params(m, L.tp);
    h.working_params = P > 0 ? std::min(mem.params, mem.params * block / P) : 0.0;
    h.working_grads = P > 0 ? std::min(mem.grads, mem.grads * block / P) : 0.0;
    h.working_activations =
        std::min(mem.activations, block_activation_bytes(w, c.micro_batch, L.tp, Recompute::none));
    mem.on_chip = mem.total;
    mems[p] = mem;
  }
  const double limit = o.memory_limit > 0 ? o.memory_limit : double(hw.memory);
  // A streaming tier takes what overflows the fast memory, rank by rank.
  std::vector<StreamPlan> streamed(L.pp);
  if (hw.streaming_memory > 0)
    for (int p = 0; p < L.pp; ++p) {
      streamed[p] = stream_overflow(held[p], limit, double(hw.streaming_memory));
      mems[p].streamed = streamed[p].bytes;
      mems[p].on_chip = mems[p].total - streamed[p].bytes;
    }
  // The rank that needs the most of the device's memory (then the most in all) is the one shown.
  est.fits = true;
  for (int p = 0; p < L.pp; ++p) {
    const MemoryEstimate& mem = mems[p];
    est.fits = est.fits && (hw.streaming_memory > 0 ? streamed[p].fits : mem.total <= limit);
    if (p == 0 || mem.on_chip > est.memory.on_chip ||
        (mem.on_chip == est.memory.on_chip && mem.total > est.memory.total))
      est.memory = mem;
  }
  if (!est.fits && !o.time_if_unfit) return est;

  // ---- time: every chunk's forward, backward and weight-gradient time
  std::vector<std::vector<double>> F(L.pp, std::vector<double>(v)), B = F, W = F;
  std::vector<double> rank_tp(L.pp, 0.0), rank_compute(L.pp, 0.0), rank_f(L.pp, 0.0), rank_b(L.pp, 0.0);
  for (int p = 0; p < L.pp; ++p)
    for (int ci = 0; ci < v; ++ci) {
      const LayerRange& r = part.of(p, ci);
      const ChunkTime t = cost.chunk(r.n_blocks(), r.has_embedding, r.has_head);
      F[p][ci] = t.f;
      B[p][ci] = t.b;
      W[p][ci] = t.w;
      rank_tp[p] += est.n_micro * (t.f_tp + t.b_tp);
      rank_f[p] += t.f;
      rank_b[p] += t.b;
      rank_compute[p] += est.n_micro * (t.f + t.b - t.f_tp - t.b_tp);
    }
  // Streamed bytes cross the link while the rank waits for them (an IPU alternates compute and
  // exchange), spread over its chunks by their blocks; the update's share comes after the schedule.
  std::vector<double> rank_stream(L.pp, 0.0);  // in the schedule, per step
  if (hw.streaming_memory > 0)
    for (int p = 0; p < L.pp; ++p) {
      const StreamPlan& sp = streamed[p];
      if (sp.bytes <= 0) continue;
      int blocks = 0;
      for (int ci = 0; ci < v; ++ci) blocks += part.of(p, ci).n_blocks();
      for (int ci = 0; ci < v; ++ci) {
        const double share = blocks > 0 ? double(part.of(p, ci).n_blocks()) / blocks : 1.0 / v;
        F[p][ci] += share * sp.forward / hw.streaming_bandwidth;
        B[p][ci] += share * sp.backward / hw.streaming_bandwidth;
      }
      rank_stream[p] = est.n_micro * (sp.forward + sp.backward) / hw.streaming_bandwidth;
    }

  // ---- the schedule
  double makespan = 0;
  std::vector<double> transfer(L.pp, 0.0);
  if (L.pp == 1) {
    makespan = est.n_micro * (F[0][0] + B[0][0]);
  } else {
    const Simulator& sim = cache.simulator(est.schedule, L.pp, v, est.n_micro);
    CheckOptions opt;
    opt.chunk_forward = std::move(F);
    opt.chunk_backward = std::move(B);
    if (sim.schedule().split_backward()) opt.chunk_weight = W;
    const double msg =
        N * D * eb.wire / (w.engine == EngineKind::megatron || est.sequence_parallel ? L.tp : 1);
    opt.t_transfer = collective(hw, Coll::p2p, msg, 2, place.pp_inter());
    const CheckResult r = sim.run(opt);
    makespan = r.makespan;
    est.time.bubble_fraction = r.bubble;
    transfer = r.transfer;
    B = std::move(opt.chunk_backward);
  }

  // ---- after the schedule: data parallelism, ZeRO, tied embeddings, scalars, optimizer
  Pricer price(hw, place.busy());
  double post = 0, dp_exposed_max = 0, opt_max = 0, tied_max = 0;
  for (int p = 0; p < L.pp; ++p) {
    const double P = rank_params[p];
    const double grad_bytes = P * eb.grad;
    const bool inter = place.dp_inter(p);
    double dp = 0;
    if (L.dp > 1) {
      // What one micro-batch's backward can hide (without a pipeline the reduction runs beside
      // the last backward, or under ZeRO 2 beside each one).
      // Megatron-LM of 2021-22 reduced the gradients after the backward ("we do not use any
      // overlapping of gradient all-reduces with back-propagation", Korthikanti et al. §6).
      const double overlap = w.engine == EngineKind::megatron ? 0.0 : hw.comm_overlap;
      const double hidden = L.pp == 1 ? overlap * B[0][0] : 0.0;
      if (w.zero >= 2) {
        const double rs = collective(hw, Coll::reduce_scatter, grad_bytes, L.dp, inter, place.dp_members());
        dp += L.pp == 1 ? est.n_micro * std::max(0.0, rs - hidden) : rs;
      } else {
        const double ar = collective(hw, Coll::allreduce, grad_bytes, L.dp, inter, place.dp_members());
        dp += std::max(0.0, ar - hidden);
      }
      if (w.zero >= 1)  // the updated parameters (troupe gathers its f32 masters)
        dp += collective(hw, Coll::allgather, P * (w.engine == EngineKind::troupe ? 4 : eb.kept), L.dp, inter,
                         place.dp_members());
      if (w.zero == 3)  // each chunk's parameters gathered before its forward and its backward
        dp += (1.0 - hw.comm_overlap) * 2 *
              collective(hw, Coll::allgather, P * eb.kept, L.dp, inter, place.dp_members());
    }
    double tied = 0;
    if (L.pp > 1 && m.tied() && (p == 0 || p == L.pp - 1))
      tied = collective(hw, Coll::allreduce, embedding_params(m, L.tp, w.engine) * 4, 2, place.embed_inter());
    // The optimizer over this rank's (ZeRO: owned) parameters: AdamW, the norm, clipping;
    // zeroing the gradients; the 16-bit copy; fp16's inf check and unscale.
    const double owned = w.zero >= 1 ? P / L.dp : P;
    double opt_bytes = owned * (28 + 4 + 8) + P * 4;
    if (w.compute != DType::f32) opt_bytes += P * 6;
    if (w.compute == DType::f16) opt_bytes += P * 12;
    const double optimizer = price.sweep(opt_bytes, 4) +
                             (hw.streaming_memory > 0 ? streamed[p].step / hw.streaming_bandwidth : 0.0);
    dp_exposed_max = std::max(dp_exposed_max, dp);
    tied_max = std::max(tied_max, tied);
    opt_max = std::max(opt_max, optimizer);
    post = std::max(post, dp + tied + optimizer);
  }
  const int scalar_reductions = w.compute == DType::f16 ? 3 : 2;
  const double scalars =
      scalar_reductions * collective(hw, Coll::allreduce, 8, L.world(), place.world_inter());
  est.time.step = makespan + post + scalars + hw.step_overhead;

  // ---- the busiest rank's breakdown
  int busiest = 0;
  for (int p = 1; p < L.pp; ++p)
    if (rank_compute[p] + rank_tp[p] > rank_compute[busiest] + rank_tp[busiest]) busiest = p;
  TimeEstimate& T = est.time;
  T.compute = rank_compute[busiest];
  T.forward = rank_f[busiest];
  T.backward = rank_b[busiest];
  T.tp_comm = rank_tp[busiest];
  T.pp_comm = transfer[busiest];
  T.bubble = std::max(0.0, makespan - T.compute - T.tp_comm - T.pp_comm - rank_stream[busiest]);
  T.streaming = rank_stream[busiest] +
                (hw.streaming_memory > 0 ? streamed[busiest].step / hw.streaming_bandwidth : 0.0);
  T.dp_comm = dp_exposed_max;
  T.optimizer = opt_max;
  T.other = tied_max + scalars + hw.step_overhead;
  T.comm_share = (T.tp_comm + T.pp_comm + T.dp_comm + tied_max + scalars) / T.step;
  est.tokens_per_s = double(w.global_batch) * m.seq_len / est.time.step;
  est.mfu = model_flops_per_step(w) / (est.time.step * L.world() * hw.peak(w.compute));
  return est;
}

}  // namespace troupe::plan
