// The planner's cost model: the time and the memory of one optimizer step of a job on
// a layout, from the model's shape and a hardware profile (plan/hardware.hpp).
//
// Time. Every layer is a list of kernels: GEMMs (their FLOPs at the rate the profile
// gives for that shape and dtype), the fused causal attention (attention_flops, at
// attention_efficiency of peak), and memory-bound kernels (their bytes at elementwise_efficiency of the
// memory bandwidth), each plus a launch overhead; tensor-parallel collectives sit inside the layers, on the
// critical path. The pipeline is simulated from the real schedule table (plan/schedule.hpp: the same table
// the executor runs) with each chunk's forward, backward and weight-gradient times and the p2p transfer time,
// so the bubble comes out of the simulation. After it: the data-parallel reduction (the part the backward
// does not hide), ZeRO's gathers, the tied-embedding sum, the scalar reductions, the optimizer, and a fixed
// per-step overhead. Collectives follow the alpha-beta (latency + bytes / bandwidth) ring formulas of
// hardware.hpp, on the tier the group's placement decides: ranks fill nodes in rank order, rank = (d * pp +
// p) * tp + t (plan/grid.hpp), so a group whose ranks all sit on one node talks within it.
//
// Memory (bytes on the busiest rank). Parameters, gradients and optimizer state by
// precision and ZeRO stage; activations per in-flight micro-batch (the schedule's peak,
// from the simulation) by recompute mode and sequence parallelism; the embedding and the
// logits; scratch; the process's own memory and the allocator's slack. Two accountings:
//   troupe    exactly what troupe's engine allocates (model/layers.hpp, model/stage.cpp):
//             f32 residual stream, the compute dtype for the Linear inputs and q|k|v;
//             master weights f32 (4 B/param, + 2 B 16-bit copy), f32 gradients, AdamW
//             m and v (8 B/param);
//   megatron  Megatron-LM's (Korthikanti et al. 2022, table 2: 34 sbh bytes per layer in
//             16 bits with dropout, divided as tensor and sequence parallelism divide
//             them; 18 B/param, 6 + 12/dp with the distributed optimizer) — for GPU jobs
//             and for comparing with published runs.
// Both price attention as a fused, flash-style causal kernel (what troupe's CPU kernel and
// its CUDA twin run): tiles of 64 query rows against the keys up to each tile's last row,
// an online softmax, per layer only q|k|v, the output and one f32 log-sum-exp per query row
// and head kept, the backward recomputing the probabilities tile by tile. No s x s term in
// memory; selective recomputation (the probabilities) is priced as none.
// AttentionKind::materialized prices instead a kernel that keeps the s x s scores (the
// published runs of 2021-22 used one).
//
// A profile with a streaming tier (an IPU's Streaming Memory: hardware.hpp) takes what
// overflows a device's memory, rank by rank, cheapest traffic per byte first (the optimizer,
// then activations, gradients, weights, beyond a block's working set), and the step pays the
// streamed bytes at the link's bandwidth (plan/streaming.cpp).
//
// What troupe runs today is narrower than what the model prices (sequence parallelism,
// ZeRO 3, pipelines and tensor groups of GPUs, IPUs): Estimate::runnable says why a candidate
// is not.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/layout.hpp"
#include "core/spec.hpp"
#include "plan/hardware.hpp"
#include "plan/partition.hpp"
#include "plan/schedule.hpp"

namespace troupe::plan {

enum class EngineKind : uint8_t { troupe, megatron };
// How attention is priced: the fused causal kernel troupe runs (the default), or a kernel that
// materialises the s x s scores — to price published runs that used one (Megatron-LM 2021-22).
enum class AttentionKind : uint8_t { fused, materialized };
const char* to_string(AttentionKind k);  // "fused", "materialized"

// What the cost of a job depends on besides its layout.
struct Workload {
  ModelShape model;
  int64_t global_batch = 1;  // sequences per optimizer step
  DType compute = DType::f32;
  int zero = 0;  // 0..3
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  bool sequence_parallel = false;
  EngineKind engine = EngineKind::troupe;
  AttentionKind attention = AttentionKind::fused;
  DeviceKind device = DeviceKind::cpu;  // what the job asks for (troupe trains on cpu today)
  // checkpoint.memory_every > 0 on the CPU: two host copies of the fp32 weights and AdamW's
  // moments per rank (worker/memory_snapshot.hpp).
  bool memory_snapshots = false;
  // resources.placement: spread puts buddies on other hosts, where their copies are copies.
  bool spread = false;
};
Workload workload(const JobSpec& spec);

// One point of the planner's search.
struct Candidate {
  Layout layout;
  int virtual_stages = 1;  // > 1: the interleaved schedule
  int micro_batch = 1;     // rows per forward/backward
  Recompute recompute = Recompute::none;
  // "2x2x1 v2 mb4 full" (v, when 1, left out).
  std::string str() const;
};

struct MemoryEstimate {
  double params = 0;     // master weights (+ 16-bit copy); ZeRO 3: this rank's part + a gathered chunk
  double grads = 0;      // what stays resident between buckets
  double optimizer = 0;  // AdamW's moments (megatron: + the fp32 master)
  double snapshots =
      0;  // in-memory snapshots (checkpoint.memory_every), with the buddy's copies: host memory
  double activations = 0;  // in-flight micro-batches, logits, scratch
  double other = 0;        // the process and the allocator's slack
  double total = 0;
  double streamed = 0;    // of total, what lives in the profile's streaming tier (0 without one)
  double on_chip = 0;     // of total, what the device's own memory holds (total without a streaming tier)
  int pipeline_rank = 0;  // the pipeline rank this is of (the one that needs the most of a device)
};

struct TimeEstimate {
  double step = 0;       // s per optimizer step
  double compute = 0;    // the busiest rank's kernels (forward, backward, recomputation)
  double tp_comm = 0;    // its tensor-parallel collectives
  double pp_comm = 0;    // its point-to-point transfers
  double bubble = 0;     // its idle time in the schedule
  double dp_comm = 0;    // the data-parallel reduction and ZeRO gathers, as far as not hidden
  double optimizer = 0;  // AdamW, clipping, the 16-bit copy
  double other = 0;      // tied-embedding sum, scalar reductions, per-step overhead
  // Its transfers to and from a streaming tier: per micro-batch in the schedule (beside compute),
  // and the update's (counted in optimizer too).
  double streaming = 0;
  double forward = 0, backward = 0;  // one micro-batch through the busiest rank's chunks
  double bubble_fraction = 0;        // the schedule's idle share (simulated; 0 without a pipeline)
  double comm_share = 0;             // (tp + pp + dp + tied + scalar comm) / step
};

struct Estimate {
  Candidate candidate;
  bool sequence_parallel = false;  // the workload's (a spec setting, not searched)
  int n_micro = 1;                 // micro-batches per step on each rank
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  std::vector<int> boundaries;  // model chunk k holds blocks [b[k], b[k+1]), balanced by cost
  MemoryEstimate memory;
  TimeEstimate time;
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOPs (3 x forward at full attention, no recomputation) / (step x world x peak)
  bool fits = false;
  std::string runnable;  // "" when troupe's engine runs this today, else why not
};

// Why a candidate cannot be planned at all (divisibility, too few layers, a schedule that
// does not apply); "" when it can.
std::string refusal(const Workload& w, const Candidate& c);

// Checked schedule tables by (schedule, pipeline, virtual stages, micro-batches), and the
// activation slots each needs: built once, shared by the estimates of a search.
class ScheduleCache {
 public:
  const Simulator& simulator(ScheduleKind kind, int pp, int v, int m);
  // [p * v + c]: the peak in-flight micro-batches of local chunk c on pipeline rank p.
  const std::vector<int>& slots(ScheduleKind kind, int pp, int v, int m);

 private:
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Simulator>> sims_;
  std::map<std::tuple<int, int, int, int>, std::vector<int>> slots_;
};

struct EstimateOptions {
  double memory_limit = 0;         // bytes a device has (0: the profile's)
  ScheduleCache* cache = nullptr;  // null: a cache of this call's own
  bool time_if_unfit = true;       // false: a candidate that does not fit gets no time (a search skips it)
};

// The estimate of a candidate that refusal() accepts; throws troupe::Error for a refused one.
Estimate estimate(const Workload& w, const Candidate& c, const HardwareProfile& hw,
                  const EstimateOptions& o = {});

// ---- the pieces, for tests and for the benchmarks' reports

// Parameters one tensor shard holds of one block, of the embedding (wte, and wpe for gpt),
// and of the head (ln_f, plus lm_head when the head does not share the chunk's wte). The
// embedding and the LM head are split by vocabulary for llama in troupe, and for every
// model in Megatron-LM (VocabParallelEmbedding); troupe's GPT keeps them whole on each shard.
bool vocab_parallel(const ModelShape& m, EngineKind e);
double block_params(const ModelShape& m, int tp);
double embedding_params(const ModelShape& m, int tp, EngineKind e = EngineKind::troupe);
double head_params(const ModelShape& m, int tp, bool with_embedding, EngineKind e = EngineKind::troupe);
// The parameters of the whole model (tp 1, the tied head counted once).
double model_params(const ModelShape& m);
// Model FLOPs of one optimizer step: 3 x the forward's, attention at full s x s.
double model_flops_per_step(const Workload& w);

// The share of the full s x s attention square the fused causal kernel computes: queries in
// blocks of 64 rows against the keys up to each block's last row (about half, plus the
// diagonal blocks).
double causal_fraction(int s);
// FLOPs of the fused causal attention of one micro-batch of `b` rows on one tensor shard, for
// every query head of the shard: forward two products (S = q k^T, O = P v), backward five (S
// recomputed, dV, dP, dQ, dK), each 2 b heads head_dim s^2 causal_fraction(s).
struct AttentionFlops {
  double forward = 0, backward = 0;
};
AttentionFlops attention_flops(const ModelShape& m, int b, int tp);
// The one tensor the fused attention keeps besides q|k|v and its output: the f32
// log-sum-exp of every query row, (b, heads / tp, s).
double attention_lse_bytes(const ModelShape& m, int b, int tp);
// What the cost model assumes of attention, for `troupe plan` to say.
const char* attention_assumed(const Workload& w);

// Activation bytes one in-flight micro-batch of `b` rows keeps per block, on one shard.
double block_activation_bytes(const Workload& w, int b, int tp, Recompute r);
// What a troupe model::Stage of chunk `r` allocates besides its parameters and gradients:
// `n_slots` in-flight micro-batches of `b` rows (the blocks' saved tensors, the residual
// stream, tokens, the head's normalised input and logits), the kept output gradients of a
// split backward, and the scratch shared by the slots (model::Workspace, the head's
// dlogits). Exactly the bytes the stage asks of its allocator (tests check this).
double stage_activation_bytes(const Workload& w, const LayerRange& r, int n_slots, int b, int tp,
                              Recompute rc, bool split_backward);

}  // namespace troupe::plan
