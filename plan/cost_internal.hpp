// The cost model's pieces shared by its sources (plan/cost_model.cpp, plan/model_costs.cpp,
// plan/chunk_cost.cpp, plan/streaming.cpp): the pricing of kernels and collectives, where a
// group's ranks sit, one model chunk's times, and what overflows into a streaming tier.
// Internal to troupe_plan; the public interface is plan/cost_model.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "plan/cost_model.hpp"
#include "plan/grid.hpp"

namespace troupe::plan::detail {

inline bool is_llama(const ModelShape& m) { return m.type == ModelType::llama; }
inline bool has_attention(const ModelShape& m) { return m.type != ModelType::mlp; }
inline double head_dim(const ModelShape& m) { return double(m.d_model) / m.heads(); }

// Bytes per element of what the engine keeps and sends between stages and shards.
struct EngineBytes {
  double kept;    // a Linear's saved input: the compute dtype
  double stream;  // the residual stream, pre-activations: f32 in troupe
  double wire;    // a tensor-parallel or pipeline message element
  double grad;    // a gradient element (the data-parallel reduction's)
  double scores;  // a materialised attention score or probability
};
EngineBytes engine_bytes(const Workload& w);

// The workload prices a materialised attention (AttentionKind::materialized, a model with one).
bool materialized(const Workload& w);
// The share of the s x s square a materialised kernel computes: Megatron-LM's (2021-22) all of it,
// masked; troupe's earlier CPU kernel the same blocks as the fused one.
double square_share(const Workload& w);

// ---------------------------------------------------------------- pricing kernels

class Pricer {
 public:
  // busy: the devices of the busiest node this job keeps busy (hardware.hpp: solo_speedup).
  Pricer(const HardwareProfile& hw, int busy = 0) : hw_(hw) {
    const int n = std::max(1, hw.devices_per_node);
    if (busy > 0 && busy < n && n > 1) speed_ = 1 + (hw.solo_speedup - 1) * double(n - busy) / double(n - 1);
  }

  // y(m,n) = op(A) op(B) with inner dimension k, in `dt`.
  double gemm(double m, double n, double k, GemmOp op, DType dt) const {
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    const double flops = 2 * m * n * k;
    double rate = table_rate(m, n, k, op, dt, flops);
    if (rate <= 0) rate = curve_rate(flops, dt);
    const double bytes = (m * k + n * k + m * n) * double(dtype_size(dt));
    return std::max(flops / rate, bytes / hw_.memory_bandwidth) / speed_ + hw_.kernel_overhead;
  }
  // The attention core's products (and, fused, its softmax).
  double attention(double flops, DType dt) const {
    if (flops <= 0) return 0;
    return flops / (hw_.peak(dt) * hw_.attention_efficiency) / speed_ + hw_.kernel_overhead;
  }
  // Memory-bound kernels over activations, by kind (hardware.hpp: the efficiencies).
  enum class Mem { stream, norm, activation };
  double memory(double bytes, int kernels = 1, Mem kind = Mem::stream) const {
    if (bytes <= 0) return 0;
    const double eff = kind == Mem::norm         ? hw_.norm_efficiency
                       : kind == Mem::activation ? hw_.activation_efficiency
                                                 : hw_.elementwise_efficiency;
    return bytes / (hw_.memory_bandwidth * eff) / speed_ + kernels * hw_.kernel_overhead;
  }
  // A sweep over parameter-sized buffers (the optimizer, zeroing gradients): at the memory's
  // bandwidth.
  double sweep(double bytes, int kernels = 1) const {
    if (bytes <= 0) return 0;
    return bytes / hw_.memory_bandwidth / speed_ + kernels * hw_.kernel_overhead;
  }

 private:
  double curve_rate(double flops, DType dt) const {
    const double f = hw_.gemm_half_flops > 0 ? flops / (flops + hw_.gemm_half_flops) : 1.0;
    return hw_.peak(dt) * hw_.gemm_efficiency * f;
  }
  // The nearest measured shape of the same op and dtype (then of any op, same dtype), its
  // rate scaled by the curve from its size to this one's.
  double table_rate(double m, double n, double k, GemmOp op, DType dt, double flops) const {
    const GemmPoint* best = nullptr;
    double best_d = std::numeric_limits<double>::infinity();
    for (int pass = 0; pass < 2 && !best; ++pass)
      for (const GemmPoint& g : hw_.gemm_table) {
        if (g.dtype != dt || (pass == 0 && g.op != op)) continue;
        const double d = sq(std::log(m / g.m)) + sq(std::log(n / g.n)) + sq(std::log(k / g.k));
        if (d < best_d) {
          best_d = d;
          best = &g;
        }
      }
    if (!best) return 0;
    const double f0 = 2.0 * double(best->m) * double(best->n) * double(best->k);
    return best->flops_per_s * curve_rate(flops, dt) / curve_rate(f0, dt);
  }
  static double sq(double x) { return x * x; }

  const HardwareProfile& hw_;
  double speed_ = 1.0;
};

// ---------------------------------------------------------------- collectives and placement

enum class Coll { allreduce, allgather, reduce_scatter, p2p };

// Seconds of one collective of `bytes` over `n` ranks on one tier (inter: across nodes);
// `members` of the group share a node.
double collective(const HardwareProfile& hw, Coll c, double bytes, int n, bool inter, int members = 1);

// Ranks fill nodes in rank order; a group crosses nodes when its first and last rank do.
struct Placement {
  Layout L;
  int per_node;
  int node(int rank) const { return rank / per_node; }
  int rank(int d, int p, int t) const { return rank_of(L, {d, p, t}); }
  bool tp_inter() const { return L.tp > 1 && node(rank(0, 0, 0)) != node(rank(0, 0, L.tp - 1)); }
  bool pp_inter() const {
    for (int p = 0; p + 1 < L.pp; ++p)
      if (node(rank(0, p, 0)) != node(rank(0, p + 1, 0))) return true;
    return false;
  }
  bool dp_inter(int p) const { return L.dp > 1 && node(rank(0, p, 0)) != node(rank(L.dp - 1, p, 0)); }
  // Members of a data-parallel group on one node (its ranks are pipeline x tensor apart).
  int dp_members() const { return std::max(1, std::min(L.dp, per_node / (L.pp * L.tp))); }
  bool embed_inter() const { return node(rank(0, 0, 0)) != node(rank(0, L.pp - 1, 0)); }
  bool world_inter() const { return node(0) != node(L.world() - 1); }
  // Devices busy on the fullest node (ranks fill nodes in order).
  int busy() const { return std::min(L.world(), per_node); }
};

// ---------------------------------------------------------------- one chunk's times

// Seconds of one micro-batch through a chunk: forward, backward (all of it), and the part
// of the backward that is weight gradients (W, where the schedule splits it). tp is the
// part of each that is tensor-parallel communication.
struct ChunkTime {
  double f = 0, b = 0, w = 0;
  double f_tp = 0, b_tp = 0;
};

// The times of a candidate's model chunks, kernel by kernel (one micro-batch on one shard).
class ChunkCoster {
 public:
  ChunkCoster(const Workload& w, const Candidate& c, const HardwareProfile& hw, const Placement& place);
  // A chunk of n_blocks blocks, with the embedding and/or the head.
  ChunkTime chunk(int n_blocks, bool embedding, bool head) const;
  // One block's forward + backward without recomputation, and the embedding and head's: the
  // partition's costs.
  StageCosts stage_costs() const;

 private:
  // A Linear's forward, input-gradient and weight-gradient seconds.
  struct Lin {
    double f, bx, bw;
  };
  static void add(ChunkTime& a, const ChunkTime& b);
  double tp_allreduce(double elements) const;
  Lin linear(double in, double out, bool bias) const;
  double norm_fwd() const;
  double norm_bwd() const;
  double residual_fwd() const;
  double residual_bwd() const;
  double act_fwd(bool swiglu) const;
  double act_bwd(bool swiglu) const;
  double attention_fwd() const;
  double attention_bwd() const;
  ChunkTime block(Recompute r) const;
  ChunkTime embed() const;
  ChunkTime head_time() const;

  const Workload& w_;
  const Candidate& c_;
  const HardwareProfile& hw_;
  Pricer price_;
  bool tp_inter_;
  int b_ = 1, t_ = 1;
  double s_ = 1, N_ = 1, D_ = 1, H_ = 1;
  EngineBytes e_{};
  DType dt_ = DType::f32, attn_dt_ = DType::f32;
  bool sp_ = false;
  ChunkTime block_;
};

// ---------------------------------------------------------------- a streaming tier

// What one pipeline rank holds (MemoryEstimate's parts) and moves per micro-batch.
struct RankBytes {
  double params = 0, grads = 0, optimizer = 0, activations = 0, total = 0;
  double act_one = 0;  // the activations one micro-batch leaves through the rank's chunks
  // What must stay in the fast memory while a block computes: its weights and gradients and one
  // micro-batch's activations inside it (the rest of each part may stream).
  double working_params = 0, working_grads = 0, working_activations = 0;
  int n_micro = 1;   // micro-batches per step
  int passes = 2;    // reads of the weights per micro-batch: forward, backward (+ recomputation)
  double slack = 0;  // the allocator's slack per byte (hardware.hpp), which moves with the byte
};
// The rank's bytes placed in the streaming tier when `total` overflows `on_chip`, cheapest
// traffic per byte first, and the bytes that cross the link. A part's working share never
// streams: a rank whose working set and process do not fit on chip does not fit.
struct StreamPlan {
  double bytes = 0;     // placed in the streaming tier
  double forward = 0;   // moved per micro-batch during the rank's forwards
  double backward = 0;  // moved per micro-batch during its backwards
  double step = 0;      // moved once per step (the update)
  bool fits = true;     // the rest fits on chip, and the streamed part in `capacity`
};
StreamPlan stream_overflow(const RankBytes& r, double on_chip, double capacity);

}  // namespace troupe::plan::detail
