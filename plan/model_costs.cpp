// What a model holds and does, counted: parameters per shard, the attention's FLOPs, the
// activation bytes a micro-batch keeps (troupe's engine exactly, or Megatron-LM's accounting),
// and the model FLOPs of a step (plan/cost_model.hpp).
#include <algorithm>

#include "plan/cost_internal.hpp"

namespace troupe::plan {

using namespace detail;

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

double causal_fraction(int s) {
  const int kBlock = 64;
  double sum = 0;
  for (int r0 = 0; r0 < s; r0 += kBlock) {
    const int r1 = std::min(s, r0 + kBlock);
    sum += double(r1 - r0) * r1;
  }
  return sum / (double(s) * s);
}

AttentionFlops attention_flops(const ModelShape& m, int b, int tp) {
  if (!has_attention(m)) return {};
  const double s = m.seq_len,
               unit = 2.0 * b * (double(m.heads()) / tp) * head_dim(m) * s * s * causal_fraction(m.seq_len);
  // Forward: S = q k^T and O = P v. Backward: S again (P from the saved log-sum-exp), dV = P^T dO,
  // dP = dO v^T, dQ = dS k, dK = dS^T q.
  return {2 * unit, 5 * unit};
}

double attention_lse_bytes(const ModelShape& m, int b, int tp) {
  if (!has_attention(m)) return 0;
  return 4.0 * b * (double(m.heads()) / tp) * m.seq_len;
}

const char* attention_assumed(const Workload& w) {
  if (!has_attention(w.model)) return "none (no attention)";
  if (w.attention == AttentionKind::materialized)
    return w.engine == EngineKind::megatron
               ? "materialised, as Megatron-LM ran it in 2021-22: the whole s x s square of scores computed, "
                 "masked, soft-maxed and kept in 16 bits (5 a s^2 b bytes per layer)"
               : "materialised: troupe's earlier CPU kernel, f32 probabilities of the causal blocks kept";
  return w.engine == EngineKind::megatron
             ? "fused causal, flash-style (FlashAttention on a GPU): no s x s scores kept, the backward "
               "recomputes them; selective recomputation priced as none"
             : "fused causal (troupe's CPU kernel): no s x s scores kept, the backward recomputes them; "
               "selective recomputation priced as none";
}

namespace detail {

EngineBytes engine_bytes(const Workload& w) {
  const double cb = double(dtype_size(w.compute));
  if (w.engine == EngineKind::megatron) return {cb, cb, cb, 4, cb};
  return {cb, 4, 4, 4, 4};
}

bool materialized(const Workload& w) {
  return w.attention == AttentionKind::materialized && has_attention(w.model);
}

double square_share(const Workload& w) {
  return w.engine == EngineKind::megatron ? 1.0 : causal_fraction(w.model.seq_len);
}

}  // namespace detail

double block_activation_bytes(const Workload& w, int b, int tp, Recompute r) {
  const ModelShape& m = w.model;
  const double s = m.seq_len, N = double(b) * s, D = m.d_model, t = tp;
  const double a = m.heads(), F = double(m.ffn());
  const bool sp = w.sequence_parallel && tp > 1;
  // The fused attention keeps, besides q|k|v and its output, one f32 log-sum-exp per query
  // row and local head: nothing of size s x s, so selective recomputation keeps what none does.
  // A materialised one keeps the probabilities instead (selective recomputation drops them).
  const bool mat = materialized(w);
  const double lse = mat ? 0.0 : attention_lse_bytes(m, b, tp);
  if (w.engine == EngineKind::megatron) {
    // Korthikanti et al. 2022, table 2: 34 s b h bytes per layer with 16-bit activations and
    // 1-byte dropout masks, + 5 a s^2 b of scores, probabilities and their dropout when
    // materialised (a flash-style kernel keeps none of them). Full recompute keeps the
    // layer's input.
    const double sbh = N * D;
    if (r == Recompute::full) return 2 * sbh / (sp ? t : 1.0);
    const double scores = mat && r != Recompute::selective ? 5 * a * s / (D * t) : 0.0;
    return (sp ? sbh * (34 / t + scores) : sbh * (10 + 24 / t + scores)) + lse;
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
  // The materialised kernel kept q|k|v in f32 and the probabilities (without selective).
  const double qkv_dt = mat ? 4.0 : e.kept;
  const double att = lse + (mat && r != Recompute::selective ? double(b) * ah * s * s * e.scores : 0.0);
  if (is_llama(m)) {
    bytes += (N * D * e.kept + N * 4) * rep;    // ln1, rstd1
    bytes += N * (ah + 2 * akv) * hd * qkv_dt;  // q|k|v after rope
    bytes += att + N * ah * hd * e.kept;        // log-sum-exp (or probabilities), the output
    bytes += N * D * 4 * rep;                   // mid
    bytes += (N * D * e.kept + N * 4) * rep;    // ln2, rstd2
    bytes += N * 2 * H * 4 + N * H * e.kept;    // gu, h
    return bytes;
  }
  bytes += (N * D * e.kept + 2 * N * 4) * rep;  // ln, mean, rstd
  bytes += N * 3 * ah * hd * qkv_dt;            // q|k|v
  bytes += att + N * ah * hd * e.kept;          // log-sum-exp (or probabilities), the output
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
  const double square = double(b) * m.heads() / t * m.seq_len * m.seq_len;
  if (rc == Recompute::selective && materialized(w)) bytes += square * e.scores;  // one shared set of scores
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
  // model::Workspace (no s x s buffer for the fused attention, which works in blocks).
  double ws = N * D * 4 * 2 + N * H * 4;
  if (attention) ws += N * qkv * 4 + (materialized(w) ? square * 4 : 0.0);
  const double fc = llama ? 2 * H : H;
  if (llama) ws += N * fc * 4;
  // The norms and activations round their kept outputs as they make them; only c_attn's q|k|v
  // stage in f32 (Workspace::act; with the materialized attention, which kept them in f32,
  // the norms' and activations' outputs staged there).
  if (cb < 4) ws += N * std::max({qkv, fc, D}) * cb + N * (materialized(w) ? std::max(D, H) : qkv) * 4;
  return bytes + ws;
}

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

}  // namespace troupe::plan
