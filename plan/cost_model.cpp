#include "plan/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "plan/grid.hpp"
#include "plan/plan.hpp"

namespace troupe::plan {

Workload workload(const JobSpec& spec) {
  Workload w;
  w.model = model_shape(spec);
  w.global_batch = spec.train.global_batch;
  w.compute = compute_dtype(spec.train.precision);
  w.zero = spec.train.zero;
  w.schedule = schedule_kind(spec.parallel.schedule);
  w.sequence_parallel = spec.parallel.sequence_parallel;
  w.device = spec.resources.device;
  // troupe's engine trains on the CPU; a GPU job is priced as Megatron-LM runs it (16-bit
  // activations, batched-GEMM attention), the design the GPU engine follows.
  w.engine = w.device == DeviceKind::cuda ? EngineKind::megatron : EngineKind::troupe;
  return w;
}

std::string Candidate::str() const {
  std::string s = layout.str();
  if (virtual_stages > 1) s += " v" + std::to_string(virtual_stages);
  s += " mb" + std::to_string(micro_batch) + " " + to_string(recompute);
  return s;
}

// ---------------------------------------------------------------- counting

namespace {

bool is_llama(const ModelShape& m) { return m.type == ModelType::llama; }
bool has_attention(const ModelShape& m) { return m.type != ModelType::mlp; }
double head_dim(const ModelShape& m) { return double(m.d_model) / m.heads(); }

}  // namespace

double block_params(const ModelShape& m, int tp) {
  const double D = m.d_model, F = double(m.ffn()), t = tp;
  if (m.type == ModelType::mlp) return (2 * F * D + F) / t + 3 * D;  // c_fc, c_proj; ln_2 and its bias whole
  if (is_llama(m)) {
    const double kvw = m.kv_heads() * head_dim(m);
    return (2 * D * D + 2 * kvw * D + 3 * F * D) / t + 2 * D;
  }
  // ln_1, ln_2 (4D) and the row-parallel biases (2D) are whole on every shard.
  return (4 * D * D + 2 * F * D + 3 * D + F) / t + 6 * D;
}

bool vocab_parallel(const ModelShape& m, EngineKind e) { return is_llama(m) || e == EngineKind::megatron; }

double embedding_params(const ModelShape& m, int tp, EngineKind e) {
  const double D = m.d_model, V = vocab_parallel(m, e) ? double(m.vocab_size) / tp : m.vocab_size;
  return V * D + (m.type == ModelType::gpt ? double(m.seq_len) * D : 0.0);  // wte (+ wpe, whole)
}

double head_params(const ModelShape& m, int tp, bool with_embedding, EngineKind e) {
  const double D = m.d_model, V = vocab_parallel(m, e) ? double(m.vocab_size) / tp : m.vocab_size;
  const double norm = is_llama(m) ? D : 2 * D;
  if (with_embedding && m.tied()) return norm;  // the head reads the chunk's own wte
  return norm + V * D;                          // lm_head, or wte's tied copy
}

double model_params(const ModelShape& m) {
  return m.n_layers * block_params(m, 1) + embedding_params(m, 1) + head_params(m, 1, true);
}

double causal_fraction(EngineKind e, int s) {
  if (e == EngineKind::megatron) return 1.0;
  const int kBlock = 64;
  double sum = 0;
  for (int r0 = 0; r0 < s; r0 += kBlock) {
    const int r1 = std::min(s, r0 + kBlock);
    sum += double(r1 - r0) * r1;
  }
  return sum / (double(s) * s);
}

namespace {

// Bytes per element of what the engine keeps and sends between stages and shards.
struct EngineBytes {
  double kept;     // a Linear's saved input: the compute dtype
  double stream;   // the residual stream, scores, pre-activations: f32 in troupe
  double wire;     // a tensor-parallel or pipeline message element
  double grad;     // a gradient element (the data-parallel reduction's)
  double attn_dt;  // bytes of the attention's scores
};

EngineBytes engine_bytes(const Workload& w) {
  const double cb = double(dtype_size(w.compute));
  if (w.engine == EngineKind::megatron) return {cb, cb, cb, 4, cb};
  return {cb, 4, 4, 4, 4};
}

}  // namespace

double block_activation_bytes(const Workload& w, int b, int tp, Recompute r) {
  const ModelShape& m = w.model;
  const double s = m.seq_len, N = double(b) * s, D = m.d_model, t = tp;
  const double a = m.heads(), F = double(m.ffn());
  const bool sp = w.sequence_parallel && tp > 1;
  if (w.engine == EngineKind::megatron) {
    // Korthikanti et al. 2022, table 2: bytes per layer with 16-bit activations and
    // 1-byte dropout masks. Full recompute keeps the layer's input.
    const double sbh = N * D;
    if (r == Recompute::full) return 2 * sbh / (sp ? t : 1.0);
    const double scores = r == Recompute::selective ? 0.0 : 5 * a * s / (D * t);
    return sp ? sbh * (34 / t + scores) : sbh * (10 + 24 / t + scores);
  }
  // troupe: model/layers.hpp's Acts, per slot. Under full recompute a slot keeps no block
  // internals (the stage keeps each block's input: its residual, counted by the stage).
  if (r == Recompute::full) return 0.0;
  const EngineBytes e = engine_bytes(w);
  const double rep = sp ? 1.0 / t : 1.0;  // the replicated (N, D) parts, sharded by sequence parallelism
  const double H = F / t;
  double bytes = 0;
  if (m.type == ModelType::mlp) return (N * D * e.kept + 2 * N * 4) * rep + N * H * (4 + e.kept);
  const double hd = head_dim(m), ah = a / t, akv = m.kv_heads() / t;
  // The fused attention keeps each query's log-sum-exp, (b, heads, s) f32, and no scores:
  // selective recomputation has nothing left to drop.
  const double lse = double(b) * ah * s * 4;
  if (is_llama(m)) {
    bytes += (N * D * e.kept + N * 4) * rep;    // ln1, rstd1
    bytes += N * (ah + 2 * akv) * hd * e.kept;  // qkv after rope
    bytes += lse + N * ah * hd * e.kept;        // lse, atty
    bytes += N * D * 4 * rep;                   // mid
    bytes += (N * D * e.kept + N * 4) * rep;    // ln2, rstd2
    bytes += N * 2 * H * 4 + N * H * e.kept;    // gu, h
    return bytes;
  }
  bytes += (N * D * e.kept + 2 * N * 4) * rep;  // ln, mean, rstd
  bytes += N * 3 * ah * hd * e.kept;            // qkv
  bytes += lse + N * ah * hd * e.kept;          // lse, atty
  bytes += N * D * 4 * rep;                     // mid
  bytes += (N * D * e.kept + 2 * N * 4) * rep;  // the MLP's ln, mean, rstd
  bytes += N * H * 4 + N * H * e.kept;          // h_pre, h
  return bytes;
}

double stage_activation_bytes(const Workload& w, const LayerRange& r, int n_slots, int b, int tp,
                              Recompute rc, bool split_backward) {
  const ModelShape& m = w.model;
  const EngineBytes e = engine_bytes(w);
  const double cb = e.kept, N = double(b) * m.seq_len, D = m.d_model, t = tp, H = double(m.ffn()) / t;
  const bool llama = is_llama(m), attention = has_attention(m);
  const double Vl = llama ? double(m.vocab_size) / t : m.vocab_size;
  const double qkv = attention ? (m.heads() + 2.0 * m.kv_heads()) / t * head_dim(m) : 0;
  const double nb = r.n_blocks();
  double bytes = 0;
  // The blocks' internals: one set per slot, or one set in all under full recomputation.
  if (rc == Recompute::full)
    bytes += nb > 0 ? block_activation_bytes(w, b, tp, Recompute::none) : 0.0;
  else
    bytes += n_slots * nb * block_activation_bytes(w, b, tp, rc);
  // Per slot: tokens and targets, the residual stream at every block boundary, the head's
  // saved tensors, a later stage's input gradient; a split backward's kept dy (f32).
  double slot = 2 * N * 4 + (nb + 1) * N * D * 4;
  if (r.has_head) slot += N * D * cb + 2 * N * 4 + N * Vl * 4 + (llama ? N * 4 : 0);
  if (!r.has_embedding) slot += N * D * 4;
  if (split_backward)
    slot += nb * N * 4 * (llama ? 2 * D + 2 * H + qkv : m.type == ModelType::mlp ? D + H : 2 * D + H + qkv);
  bytes += n_slots * slot;
  // Shared: the head's dlogits (and its 16-bit copy), the vocabulary-parallel loss statistics.
  if (r.has_head) bytes += N * Vl * 4 + (cb < 4 ? N * Vl * cb : 0) + (llama ? (2 * t + 1) * N * 4 : 0);
  // model::Workspace.
  double ws = N * D * 4 * 2 + N * H * 4;
  if (attention) ws += N * qkv * 4;  // dqkv; the fused attention needs no (T,T) scratch
  const double fc = llama ? 2 * H : H;
  if (llama) ws += N * fc * 4;
  if (cb < 4) ws += N * std::max({qkv, fc, D}) * cb + N * std::max({D, H, qkv}) * 4;
  return bytes + ws;
}

namespace {

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

// `members` of the group share a node: across nodes NCCL runs a ring per NIC (a channel
// each), so the group's inter-node traffic has every member's NIC, up to the node's own links.
double collective(const HardwareProfile& hw, Coll c, double bytes, int n, bool inter, int members = 1) {
  if (n <= 1 || bytes <= 0) return 0;
  const NetworkTier& tier = inter ? hw.inter_node : hw.intra_node;
  const LinkCost* fit = c == Coll::allreduce        ? &tier.allreduce
                        : c == Coll::allgather      ? &tier.allgather
                        : c == Coll::reduce_scatter ? &tier.reduce_scatter
                                                    : &tier.link;
  LinkCost wide;
  if (inter && members > 1 && !fit->given() && tier.link.table.empty()) {
    wide = tier.link;
    wide.bandwidth = std::min(hw.intra_node.link.bandwidth, members * tier.link.bandwidth);
    fit = &wide;
  }
  const LinkCost& l = fit->given() ? *fit : tier.link;
  const double nn = n;
  // A collective's own fit or table is of two ranks; n ranks take n-1 times its steps of the
  // same size. The p2p link's fit prices one step, a ring's 2(n-1) or (n-1) of them.
  switch (c) {
    case Coll::allreduce:
      if (fit->given()) return (nn - 1) * l.two_ranks(2 * bytes / nn, 2, 1);
      return 2 * (nn - 1) * l.two_ranks(bytes / nn, 1, 1);
    case Coll::allgather:
    case Coll::reduce_scatter:
      if (fit->given()) return (nn - 1) * l.two_ranks(2 * bytes / nn, 1, 0.5);
      return (nn - 1) * l.two_ranks(bytes / nn, 1, 1);
    case Coll::p2p:
      return l.two_ranks(bytes, 1, 1);
  }
  return 0;
}

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

class ChunkCoster {
 public:
  ChunkCoster(const Workload& w, const Candidate& c, const HardwareProfile& hw, const Placement& place)
      : w_(w), c_(c), hw_(hw), price_(hw, place.busy()), tp_inter_(place.tp_inter()) {
    const ModelShape& m = w.model;
    b_ = c.micro_batch;
    s_ = m.seq_len;
    N_ = double(b_) * s_;
    D_ = m.d_model;
    t_ = c.layout.tp;
    H_ = double(m.ffn()) / t_;
    e_ = engine_bytes(w);
    dt_ = w.compute;
    attn_dt_ = w.engine == EngineKind::megatron ? w.compute : DType::f32;
    sp_ = w.sequence_parallel && t_ > 1;
    block_ = block(Recompute::none);
  }

  // A chunk of n_blocks blocks, with the embedding and/or the head.
  ChunkTime chunk(int n_blocks, bool embedding, bool head) const {
    ChunkTime t = block(c_.recompute);
    t.f *= n_blocks;
    t.b *= n_blocks;
    t.w *= n_blocks;
    t.f_tp *= n_blocks;
    t.b_tp *= n_blocks;
    if (embedding) add(t, embed());
    if (head) add(t, head_time());
    return t;
  }
  // One block's forward + backward without recomputation, and the embedding and head's: the
  // partition's costs.
  StageCosts stage_costs() const {
    const double unit = block_.f + block_.b;
    StageCosts sc;
    const ChunkTime e = embed(), h = head_time();
    sc.embedding = unit > 0 ? (e.f + e.b) / unit : 0;
    sc.head = unit > 0 ? (h.f + h.b) / unit : 0;
    return sc;
  }

 private:
  static void add(ChunkTime& a, const ChunkTime& b) {
    a.f += b.f;
    a.b += b.b;
    a.w += b.w;
    a.f_tp += b.f_tp;
    a.b_tp += b.b_tp;
  }
  double tp_allreduce(double elements) const {
    if (t_ <= 1) return 0;
    // Sequence parallelism turns each all-reduce into a reduce-scatter and an all-gather:
    // the same bytes on the wire.
    return collective(hw_, Coll::allreduce, elements * e_.wire, t_, tp_inter_);
  }
  // A Linear of `in` -> `out` features (local to the shard) over N rows: forward, the input
  // gradient, the weight gradient, and the bias's passes when it has one.
  struct Lin {
    double f, bx, bw;
  };
  Lin linear(double in, double out, bool bias) const {
    Lin l;
    l.f = price_.gemm(N_, out, in, GemmOp::nt, dt_);
    l.bx = price_.gemm(N_, in, out, GemmOp::nn, dt_);
    l.bw = price_.gemm(out, in, N_, GemmOp::tn, dt_);
    // troupe rounds each product's f32 dy to 16 bits (Megatron's dy is 16-bit already).
    if (dt_ != DType::f32 && w_.engine == EngineKind::troupe) l.bx += price_.memory(N_ * out * (4 + e_.kept));
    // A bias is added in the forward product's pass over its output (gemm_bias; Megatron fuses
    // it with the activation or the dropout); its gradient is a column sum of dy.
    if (bias) l.bx += price_.memory(N_ * out * e_.stream);
    return l;
  }
  // Bytes moved per element, in the engine's dtypes (troupe: an f32 residual stream).
  double norm_fwd() const {
    return price_.memory(N_ * D_ * (e_.stream + e_.kept) / (sp_ ? t_ : 1), 1, Pricer::Mem::norm);
  }
  double norm_bwd() const {
    return price_.memory(N_ * D_ * 4 * e_.stream / (sp_ ? t_ : 1), 1, Pricer::Mem::norm);
  }
  // x + branch: troupe's residual add; Megatron's fused bias-dropout-add (and its 1-byte mask).
  double residual_fwd() const {
    const double per = w_.engine == EngineKind::megatron ? 3 * e_.stream + 1 : 3 * e_.stream;
    return price_.memory(N_ * D_ * per / (sp_ ? t_ : 1));
  }
  double residual_bwd() const {
    const double per = w_.engine == EngineKind::megatron ? 2 * e_.stream + 1 : 2 * e_.stream;
    return price_.memory(N_ * D_ * per / (sp_ ? t_ : 1));
  }
  // The MLP's activation over H (gelu) or 2H -> H (SwiGLU): troupe stages f32 pre-activations
  // and keeps the output in the compute dtype; Megatron fuses it with the bias in 16 bits.
  double act_fwd(bool swiglu) const {
    const double per = swiglu ? (w_.engine == EngineKind::megatron ? 3 * e_.stream : 2 * 4 + e_.kept)
                              : (w_.engine == EngineKind::megatron ? 2 * e_.stream : 8 + e_.kept);
    return price_.memory(N_ * H_ * per, 1, Pricer::Mem::activation);
  }
  double act_bwd(bool swiglu) const {
    const double per = swiglu ? (w_.engine == EngineKind::megatron ? 5 * e_.stream : 4 + 4 + 8 + 2 * 4)
                              : 3 * (w_.engine == EngineKind::megatron ? e_.stream : 4);
    return price_.memory(N_ * H_ * per, 1, Pricer::Mem::activation);
  }
  // The attention core over the shard's heads: products (causal share) and softmax.
  double attention_fwd() const {
    const ModelShape& m = w_.model;
    const double ah = m.heads() / double(t_), hd = head_dim(m), cf = causal_fraction(w_.engine, int(s_));
    const double flops = 4.0 * b_ * ah * hd * s_ * s_ * cf;
    double t = price_.attention(flops, attn_dt_);
    if (w_.engine == EngineKind::megatron) {
      // Unfused: scale+mask+softmax reads and writes the scores, dropout reads them, writes
      // its output and a 1-byte mask.
      const double sc = b_ * ah * s_ * s_;
      t += price_.memory(sc * (2 * e_.attn_dt) + sc * (2 * e_.attn_dt + 1), 2);
    }
    return t;
  }
  double attention_bwd() const {
    const ModelShape& m = w_.model;
    const double ah = m.heads() / double(t_), hd = head_dim(m), cf = causal_fraction(w_.engine, int(s_));
    double t = price_.attention(8.0 * b_ * ah * hd * s_ * s_ * cf, attn_dt_);
    if (w_.engine == EngineKind::megatron) {
      const double sc = b_ * ah * s_ * s_;
      t += price_.memory(sc * (3 * e_.attn_dt + 1) + sc * (3 * e_.attn_dt), 2);
    }
    return t;
  }

  // One block: recompute adds its forward (full) or the attention core's (selective) to B.
  ChunkTime block(Recompute r) const {
    const ModelShape& m = w_.model;
    ChunkTime t;
    double f = 0, bx = 0, bw = 0;
    auto lin = [&](double in, double out, bool bias) {
      const Lin l = linear(in, out, bias);
      f += l.f;
      bx += l.bx;
      bw += l.bw;
    };
    if (m.type == ModelType::mlp) {
      f += norm_fwd();
      bx += norm_bwd();
      lin(D_, H_, true);
      f += act_fwd(false);
      bx += act_bwd(false);
      lin(H_, D_, true);
      t.f_tp = tp_allreduce(N_ * D_);
      t.b_tp = tp_allreduce(N_ * D_);
      f += residual_fwd();
      bx += residual_bwd();
    } else {
      const bool llama = is_llama(m);
      const double hd = head_dim(m), ah = m.heads() / double(t_), akv = m.kv_heads() / double(t_);
      const double qkv = (ah + 2 * akv) * hd;
      // Attention sublayer.
      f += norm_fwd();
      bx += norm_bwd();
      lin(D_, qkv, !llama);
      if (llama) {
        f += price_.memory(N_ * (ah + akv) * hd * 2 * e_.stream);  // rope on q and k
        bx += price_.memory(N_ * (ah + akv) * hd * 2 * e_.stream);
      }
      f += attention_fwd();
      bx += attention_bwd();
      lin(ah * hd, D_, !llama);
      f += residual_fwd();
      bx += residual_bwd();
      // MLP sublayer.
      f += norm_fwd();
      bx += norm_bwd();
      lin(D_, llama ? 2 * H_ : H_, !llama);
      f += act_fwd(llama);
      bx += act_bwd(llama);
      lin(H_, D_, !llama);
      f += residual_fwd();
      bx += residual_bwd();
      // Two all-reduces forward (after each row-parallel product), two backward (the input
      // gradients of the column-parallel ones).
      t.f_tp = 2 * tp_allreduce(N_ * D_);
      t.b_tp = 2 * tp_allreduce(N_ * D_);
      // Sequence parallelism gathers each column-parallel product's input again in the
      // backward, for its weight gradient (Korthikanti et al. 2022, section 4.2.2).
      if (sp_) t.b_tp += 2 * collective(hw_, Coll::allgather, N_ * D_ * e_.wire, t_, tp_inter_);
    }
    t.f = f + t.f_tp;
    t.w = bw;
    t.b = bx + bw + t.b_tp;
    if (r == Recompute::full) {
      t.b += t.f;
      t.b_tp += t.f_tp;
    } else if (r == Recompute::selective && has_attention(m)) {
      t.b += attention_fwd();
    }
    return t;
  }

  ChunkTime embed() const {
    const ModelShape& m = w_.model;
    ChunkTime t;
    const double pos = m.type == ModelType::gpt ? 1.0 : 0.0;
    const double e = e_.stream;
    t.f = price_.memory(N_ * D_ * (e + e * pos + e));          // gather rows (+ positions), write
    t.b = price_.memory(N_ * D_ * (e + 2 * e + 2 * e * pos));  // scatter-add into wte (and wpe)
    if (vocab_parallel(m, w_.engine) && t_ > 1) {
      t.f_tp = tp_allreduce(N_ * D_);  // each shard holds V/tp rows: the lookups are summed
      t.f += t.f_tp;
    }
    if (w_.engine == EngineKind::megatron) t.f += price_.memory(N_ * D_ * (2 * e_.stream + 1));  // dropout
    return t;
  }

  ChunkTime head_time() const {
    const ModelShape& m = w_.model;
    ChunkTime t;
    // GPT's head is whole on every shard; llama's is split by vocabulary.
    const double V = vocab_parallel(m, w_.engine) ? double(m.vocab_size) / t_ : m.vocab_size;
    const Lin l = linear(D_, V, false);
    const double ce_f = price_.memory(N_ * V * 4 * 3, 2);  // max, sum of exponentials, loss
    const double ce_b = price_.memory(N_ * V * 4 * 2);     // dlogits
    t.f = norm_fwd() + l.f + ce_f;
    t.w = l.bw + (w_.schedule == ScheduleKind::zb_h1 ? ce_b : 0.0);  // W recomputes dlogits
    t.b = norm_bwd() + ce_b + l.bx + t.w;
    if (vocab_parallel(m, w_.engine) && t_ > 1) {
      // One all-reduce of every shard's row max, sum of exponentials and target logit.
      t.f_tp = tp_allreduce(N_ * (2.0 * t_ + 1) / (e_.wire / 4));
      t.f += t.f_tp;
    }
    return t;
  }

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

}  // namespace

double model_flops_per_step(const Workload& w) {
  const ModelShape& m = w.model;
  const double s = m.seq_len, D = m.d_model, V = m.vocab_size, F = double(m.ffn());
  double per_token = 0;  // forward multiply-adds x 2 per token
  if (m.type == ModelType::mlp) {
    per_token = m.n_layers * 2 * (2 * D * F);
  } else {
    const double kvw = m.kv_heads() * head_dim(m);
    const double linears =
        is_llama(m) ? 2 * D * D + 2 * kvw * D + 3 * F * D : 2 * D * D + 2 * D * F + 2 * D * D;
    per_token = m.n_layers * 2 * (linears + 2 * s * D);  // + q k^T and att v at full s
  }
  per_token += 2 * D * V;  // the LM head
  return 3.0 * per_token * s * double(w.global_batch);
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
    if (m.n_layers % (L.pp * c.virtual_stages) != 0)
      return "interleaving gives every chunk the same number of layers: " + std::to_string(m.n_layers) +
             " layers do not divide into " + std::to_string(L.pp * c.virtual_stages) + " chunks";
  }
  if (c.virtual_stages > 1 && L.pp == 1) return "virtual stages need a pipeline";
  if (c.recompute != Recompute::none && c.recompute != Recompute::selective && c.recompute != Recompute::full)
    return "recompute must be none, selective or full";
  return "";
}

// ---------------------------------------------------------------- the estimate

namespace {

// What troupe's engine cannot run today, "" when it can.
std::string not_runnable(const Workload& w, const Candidate& c, ScheduleKind kind) {
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

Estimate estimate(const Workload& w, const Candidate& c, const HardwareProfile& hw,
                  const EstimateOptions& o) {
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
  est.runnable = not_runnable(w, c, est.schedule);
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
    }
    double act = 0;
    bool recomputes = false;
    for (int ci = 0; ci < v; ++ci) {
      const LayerRange& r = part.of(p, ci);
      const int n_slots = slots[size_t(p) * v + ci];
      if (w.engine == EngineKind::megatron) {
        act += n_slots * r.n_blocks() * block_activation_bytes(w, c.micro_batch, L.tp, c.recompute);
        // The embedding's dropout mask (its output is the first block's input, counted there).
        if (r.has_embedding) act += n_slots * N * D / (est.sequence_parallel ? L.tp : 1);
        if (r.has_head) act += N * m.vocab_size / L.tp * 4;  // fp32 logits for the loss
        recomputes = recomputes || (c.recompute == Recompute::full && r.n_blocks() > 0);
        continue;
      }
      act += stage_activation_bytes(w, r, n_slots, c.micro_batch, L.tp, c.recompute,
                                    est.schedule == ScheduleKind::zb_h1 && L.pp > 1);
    }
    // Under full recomputation a rank rebuilds one block's activations at a time.
    if (recomputes) act += block_activation_bytes(w, c.micro_batch, L.tp, Recompute::none);
    mem.activations = act;
    const double model_bytes = mem.params + mem.grads + mem.optimizer + mem.activations;
    mem.other = double(hw.process_memory) + model_bytes * hw.allocator_slack;
    mem.total = model_bytes + mem.other;
    if (mem.total > est.memory.total) est.memory = mem;
  }
  const double limit = o.memory_limit > 0 ? o.memory_limit : double(hw.memory);
  est.fits = est.memory.total <= limit;
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
    const double optimizer = price.sweep(opt_bytes, 4);
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
  T.bubble = std::max(0.0, makespan - T.compute - T.tp_comm - T.pp_comm);
  T.dp_comm = dp_exposed_max;
  T.optimizer = opt_max;
  T.other = tied_max + scalars + hw.step_overhead;
  T.comm_share = (T.tp_comm + T.pp_comm + T.dp_comm + tied_max + scalars) / T.step;
  est.tokens_per_s = double(w.global_batch) * m.seq_len / est.time.step;
  est.mfu = model_flops_per_step(w) / (est.time.step * L.world() * hw.peak(w.compute));
  return est;
}

}  // namespace troupe::plan
