// One model chunk's forward, backward and weight-gradient seconds, kernel by kernel, and the
// collectives' alpha-beta prices (plan/cost_internal.hpp).
#include <algorithm>

#include "plan/cost_internal.hpp"

namespace troupe::plan::detail {

// `members` of the group share a node: across nodes NCCL runs a ring per NIC (a channel
// each), so the group's inter-node traffic has every member's NIC, up to the node's own links.
double collective(const HardwareProfile& hw, Coll c, double bytes, int n, bool inter, int members) {
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

ChunkCoster::ChunkCoster(const Workload& w, const Candidate& c, const HardwareProfile& hw,
                         const Placement& place)
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
ChunkTime ChunkCoster::chunk(int n_blocks, bool embedding, bool head) const {
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
StageCosts ChunkCoster::stage_costs() const {
  const double unit = block_.f + block_.b;
  StageCosts sc;
  const ChunkTime e = embed(), h = head_time();
  sc.embedding = unit > 0 ? (e.f + e.b) / unit : 0;
  sc.head = unit > 0 ? (h.f + h.b) / unit : 0;
  return sc;
}

void ChunkCoster::add(ChunkTime& a, const ChunkTime& b) {
  a.f += b.f;
  a.b += b.b;
  a.w += b.w;
  a.f_tp += b.f_tp;
  a.b_tp += b.b_tp;
}
double ChunkCoster::tp_allreduce(double elements) const {
  if (t_ <= 1) return 0;
  // Sequence parallelism turns each all-reduce into a reduce-scatter and an all-gather:
  // the same bytes on the wire.
  return collective(hw_, Coll::allreduce, elements * e_.wire, t_, tp_inter_);
}
// A Linear of `in` -> `out` features (local to the shard) over N rows: forward, the input
// gradient, the weight gradient, and the bias's passes when it has one.
ChunkCoster::Lin ChunkCoster::linear(double in, double out, bool bias) const {
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
double ChunkCoster::norm_fwd() const {
  return price_.memory(N_ * D_ * (e_.stream + e_.kept) / (sp_ ? t_ : 1), 1, Pricer::Mem::norm);
}
double ChunkCoster::norm_bwd() const {
  return price_.memory(N_ * D_ * 4 * e_.stream / (sp_ ? t_ : 1), 1, Pricer::Mem::norm);
}
// x + branch: troupe's residual add; Megatron's fused bias-dropout-add (and its 1-byte mask).
double ChunkCoster::residual_fwd() const {
  const double per = w_.engine == EngineKind::megatron ? 3 * e_.stream + 1 : 3 * e_.stream;
  return price_.memory(N_ * D_ * per / (sp_ ? t_ : 1));
}
double ChunkCoster::residual_bwd() const {
  const double per = w_.engine == EngineKind::megatron ? 2 * e_.stream + 1 : 2 * e_.stream;
  return price_.memory(N_ * D_ * per / (sp_ ? t_ : 1));
}
// The MLP's activation over H (gelu) or 2H -> H (SwiGLU): troupe stages f32 pre-activations
// and keeps the output in the compute dtype; Megatron fuses it with the bias in 16 bits.
double ChunkCoster::act_fwd(bool swiglu) const {
  const double per = swiglu ? (w_.engine == EngineKind::megatron ? 3 * e_.stream : 2 * 4 + e_.kept)
                            : (w_.engine == EngineKind::megatron ? 2 * e_.stream : 8 + e_.kept);
  return price_.memory(N_ * H_ * per, 1, Pricer::Mem::activation);
}
double ChunkCoster::act_bwd(bool swiglu) const {
  const double per = swiglu ? (w_.engine == EngineKind::megatron ? 5 * e_.stream : 4 + 4 + 8 + 2 * 4)
                            : 3 * (w_.engine == EngineKind::megatron ? e_.stream : 4);
  return price_.memory(N_ * H_ * per, 1, Pricer::Mem::activation);
}
// The fused attention over the shard's heads (attention_flops): its block products with
// the online softmax inside, at attention_efficiency; nothing of size s x s goes through
// memory. Materialised: two products forward, four backward, on square_share of the square,
// and Megatron-LM's unfused passes over the scores.
double ChunkCoster::attention_fwd() const {
  if (!materialized(w_)) return price_.attention(attention_flops(w_.model, b_, t_).forward, attn_dt_);
  const double ah = w_.model.heads() / double(t_), sc = b_ * ah * s_ * s_;
  double t = price_.attention(4.0 * sc * head_dim(w_.model) * square_share(w_), attn_dt_);
  // Scale+mask+softmax reads and writes the scores, dropout reads them, writes its output
  // and a 1-byte mask.
  if (w_.engine == EngineKind::megatron)
    t += price_.memory(sc * (2 * e_.scores) + sc * (2 * e_.scores + 1), 2);
  return t;
}
double ChunkCoster::attention_bwd() const {
  if (!materialized(w_)) return price_.attention(attention_flops(w_.model, b_, t_).backward, attn_dt_);
  const double ah = w_.model.heads() / double(t_), sc = b_ * ah * s_ * s_;
  double t = price_.attention(8.0 * sc * head_dim(w_.model) * square_share(w_), attn_dt_);
  if (w_.engine == EngineKind::megatron)
    t += price_.memory(sc * (3 * e_.scores + 1) + sc * (3 * e_.scores), 2);
  return t;
}

// One block: full recomputation adds its forward to B. Selective recomputation (the attention
// probabilities) adds nothing to the fused attention, whose backward recomputes them anyway;
// to a materialised one it adds the attention's forward.
ChunkTime ChunkCoster::block(Recompute r) const {
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
  } else if (r == Recompute::selective && materialized(w_)) {
    t.b += attention_fwd();
  }
  return t;
}

ChunkTime ChunkCoster::embed() const {
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

ChunkTime ChunkCoster::head_time() const {
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

}  // namespace troupe::plan::detail
