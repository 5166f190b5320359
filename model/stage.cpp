#include "model/stage.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"

namespace troupe::model {

namespace {

// The contexts a stage can run: computing in f32, or in bf16 / f16 with a table that has
// the 16-bit linear kernels.
const DeviceContext& runnable(const DeviceContext& ctx) {
  ctx.validate();
  TROUPE_CHECK(ctx.compute_dtype == DType::f32 ||
                   (ctx.kernels->linear_forward_h != nullptr && ctx.kernels->linear_backward_h != nullptr &&
                    ctx.kernels->to_half != nullptr),
               "a stage computing in ", dtype_name(ctx.compute_dtype), " needs kernels for ",
               dtype_name(ctx.compute_dtype), " weights: the '", ctx.kernels->name, "' kernels have none");
  return ctx;
}

}  // namespace

Stage::Stage(const ModelConfig& cfg, const LayerRange& range, int n_slots, int max_micro_batch,
             const DeviceContext& ctx)
    : Stage(cfg, range, n_slots, max_micro_batch, TensorShard{}, nullptr, ctx) {}

Stage::Stage(const ModelConfig& cfg, const LayerRange& range, int n_slots, int max_micro_batch,
             const TensorShard& shard, comm::Communicator* tp_group, const DeviceContext& ctx)
    : cfg_(cfg),
      range_(range),
      ctx_(runnable(ctx)),
      k_(ctx_.kernels),
      tp_(shard, tp_group),
      max_B_(max_micro_batch),
      store_(param_specs(cfg, range, shard), cfg.seed, ctx_.compute_dtype, *ctx_.alloc, ctx_.kernels) {
  // The tensor group's collectives and the vocabulary-parallel loss run on host memory.
  TROUPE_CHECK(ctx_.device == Device::cpu || shard.size == 1, "tensor parallelism on ",
               device_name(ctx_.device),
               " needs the tensor group's collectives on device memory (NCCL), "
               "which the stage does not run yet: use tensor 1");
  TROUPE_CHECK(n_slots > 0 && max_micro_batch > 0, "need n_slots > 0 and max_micro_batch > 0, got ", n_slots,
               ", ", max_micro_batch);
  const int64_t T = cfg.seq_len, N = int64_t{max_B_} * T, D = cfg.d_model;
  for (int l = range.first; l < range.last; ++l) {
    // Under recomputation the first block owns the one set of internal activations
    // and the others borrow it; otherwise every block keeps one set per slot.
    const int act_slots = cfg.recompute ? (l == range.first ? 1 : 0) : n_slots;
    if (cfg.kind == ModelKind::gpt)
      blocks_.push_back(std::make_unique<GptBlock>(store_, l, cfg, act_slots, max_B_, tp_, ctx_));
    else if (cfg.kind == ModelKind::llama)
      blocks_.push_back(std::make_unique<LlamaBlock>(store_, l, cfg, act_slots, max_B_, tp_, ctx_));
    else
      blocks_.push_back(std::make_unique<MlpBlock>(store_, l, cfg, act_slots, max_B_, tp_, ctx_));
    if (cfg.recompute && l > range.first) blocks_.back()->share_activations(*blocks_.front());
  }
  // The embedding's wte, or on a head-only stage its tied copy (Param::tied_copy): the
  // embedding and the LM head read the same weights, unless the head has its own
  // lm_head (untied llama). The embedding reads the f32 master (a lookup, f32 under
  // autocast too), the head's product its compute copy.
  Param* wte = nullptr;
  if (range.has_embedding || (range.has_head && cfg.tied_head())) {
    wte = &store_.get("wte.weight");
    wte_ = wte->data.f32();
    dwte_ = wte->grad.f32();
  }
  v0_ = static_cast<int>(shard.vocab_begin(cfg));
  Vl_ = static_cast<int>(shard.vocab(cfg));
  if (range.has_embedding && cfg.kind == ModelKind::gpt) {
    Param& wpe = store_.get("wpe.weight");
    wpe_ = wpe.data.f32();
    dwpe_ = wpe.grad.f32();
  }
  auto f32 = [&](Shape s) { return Tensor::zeros(std::move(s), DType::f32, *ctx_.alloc); };
  auto kept = [&](Shape s) { return Tensor::zeros(std::move(s), ctx_.compute_dtype, *ctx_.alloc); };
  if (range.has_head) {
    if (cfg.kind == ModelKind::llama)
      rms_f_ = RmsNorm::bind(store_, "ln_f", *k_, cfg.norm_eps);
    else
      ln_f_ = LayerNorm::bind(store_, "ln_f", *k_);
    Param& hw = cfg.tied_head() ? *wte : store_.get("lm_head.weight");
    head_.k = k_;
    head_.dt = ctx_.compute_dtype;
    if (head_.dt == DType::f32)
      head_.w = hw.compute.f32();
    else
      head_.wh = hw.compute.h16();
    head_.dw = hw.grad.f32();
    head_.in = static_cast<int>(D);
    head_.out = Vl_;
    dlogits_ = f32({N, Vl_});
    if (head_.dt != DType::f32) dlogits_h_ = kept({N, Vl_});
    if (cfg.vocab_parallel()) ce_stats_ = f32({(2 * int64_t{shard.size} + 1) * N});
  }
  const float* flat = store_.flat_grads().f32();
  const size_t n_flat = static_cast<size_t>(store_.flat_grads().numel());
  auto offset_of = [&](const Param& p) { return static_cast<size_t>(p.grad.f32() - flat); };
  head_begin_ = range.has_head ? offset_of(store_.get("ln_f.weight")) : n_flat;
  block_begin_.assign(blocks_.size(), n_flat);
  for (const Param& p : store_.params())
    for (int l = range.first; l < range.last; ++l)
      if (p.name.rfind("h." + std::to_string(l) + ".", 0) == 0) {
        size_t& b = block_begin_[static_cast<size_t>(l - range.first)];
        b = std::min(b, offset_of(p));
      }
  ws_ = Workspace(cfg, max_B_, shard, *ctx_.alloc, ctx_.compute_dtype);
  slots_.resize(static_cast<size_t>(n_slots));
  for (Slot& s : slots_) {
    s.tokens = Tensor::zeros({N}, DType::i32, *ctx_.alloc);
    s.targets = Tensor::zeros({N}, DType::i32, *ctx_.alloc);
    for (int b = 0; b <= range.n_blocks(); ++b) s.resid.push_back(f32({N, D}));
    if (range.has_head) {
      s.lnf = kept({N, D});
      s.lnf_mean = f32({N});
      s.lnf_rstd = f32({N});
      s.logits = f32({N, Vl_});
      if (cfg.vocab_parallel()) s.lse = f32({N});
    }
    if (!range.has_embedding) s.dinput = f32({N, D});
  }
}

Stage::~Stage() = default;

Stage::Slot& Stage::slot_at(int slot) {
  TROUPE_CHECK(slot >= 0 && slot < n_slots(), "slot ", slot, " out of range [0, ", n_slots(), ")");
  return slots_[static_cast<size_t>(slot)];
}

double Stage::forward(int slot, const int32_t* tokens, const float* x_in, const int32_t* targets, int B,
                      int T) {
  Slot& s = slot_at(slot);
  TROUPE_CHECK(!s.weights_pending, "forward(", slot,
               ") while the slot's weight gradients are pending: backward_weights first");
  TROUPE_CHECK(B > 0 && B <= max_B_, "micro-batch ", B, " outside [1, ", max_B_, "]");
  TROUPE_CHECK(T > 0 && T <= cfg_.seq_len, "T = ", T, " outside [1, ", cfg_.seq_len, "]");
  const int N = B * T, D = cfg_.d_model, V = cfg_.vocab_size;
  const size_t nd = static_cast<size_t>(N) * D;
  s.B = B;
  s.T = T;
  s.forwarded = false;
  if (range_.has_embedding) {
    TROUPE_CHECK(tokens != nullptr, "the first stage needs tokens");
    for (int i = 0; i < N; ++i)
      TROUPE_CHECK(tokens[i] >= 0 && tokens[i] < V, "token ", tokens[i], " at ", i, " outside [0, ", V, ")");
    ctx_.alloc->copy_from_host(s.tokens.data(), tokens, sizeof(int32_t) * static_cast<size_t>(N));
    if (cfg_.vocab_parallel()) {
      // Each shard looks up the tokens of its rows; the sum over shards is the embedding.
      k_->embedding_rows_forward(s.resid[0].f32(), s.tokens.i32(), wte_, N, D, v0_, Vl_);
      reduce_from_tensor_region_forward(tp_, s.resid[0].f32(), nd);
    } else {
      k_->embedding_forward(s.resid[0].f32(), s.tokens.i32(), wte_, wpe_, B, T, D, V);
    }
  } else {
    TROUPE_CHECK(x_in != nullptr, "a stage without the embedding needs its input activations");
    ctx_.alloc->copy_from_host(s.resid[0].data(), x_in, sizeof(float) * nd);
  }
  for (size_t b = 0; b < blocks_.size(); ++b)
    blocks_[b]->forward(cfg_.recompute ? 0 : slot, s.resid[b + 1].f32(), s.resid[b].f32(), B, T, ws_);
  s.forwarded = true;
  s.has_targets = false;
  if (!range_.has_head) return 0.0;

  // In mixed precision ln_f's output is kept in the compute dtype for the head's product.
  if (cfg_.kind == ModelKind::llama)
    rms_f_.forward(s.lnf, s.lnf_rstd.f32(), s.resid.back().f32(), N);
  else
    ln_f_.forward(s.lnf, s.lnf_mean.f32(), s.lnf_rstd.f32(), s.resid.back().f32(), N);
  if (cfg_.vocab_parallel()) copy_to_tensor_region_forward(tp_, s.lnf);
  head_.forward(s.logits.f32(), s.lnf, N, /*with_bias=*/false);
  if (targets == nullptr) return 0.0;
  for (int i = 0; i < N; ++i)
    TROUPE_CHECK(targets[i] >= 0 && targets[i] < V, "target ", targets[i], " at ", i, " outside [0, ", V,
                 ")");
  ctx_.alloc->copy_from_host(s.targets.data(), targets, sizeof(int32_t) * static_cast<size_t>(N));
  s.has_targets = true;
  if (cfg_.vocab_parallel()) return vocab_parallel_loss(s, N);
  return k_->cross_entropy(nullptr, s.logits.f32(), s.targets.i32(), N, V, 0.0f);
}

double Stage::vocab_parallel_loss(Slot& s, int N) {
  // One allreduce-sum gathers every shard's row max and sum of exponentials into its own
  // columns (zeros elsewhere, so the sum is exact) and the target logit from the shard
  // that holds it: [max (tp x N) | sum_exp (tp x N) | target (N)]. Every shard then
  // combines the same numbers in the same order, so the loss is the same bits on each.
  const int tp = tp_.size(), r = tp_.shard.rank;
  const size_t n = static_cast<size_t>(N), n_stats = (2 * static_cast<size_t>(tp) + 1) * n;
  float* dev = ce_stats_.f32();
  ctx_.alloc->zero(dev, sizeof(float) * n_stats);
  k_->cross_entropy_stats(dev + r * n, dev + (tp + r) * n, dev + 2 * static_cast<size_t>(tp) * n,
                          s.logits.f32(), s.targets.i32(), N, Vl_, v0_);
  reduce_from_tensor_region_forward(tp_, dev, n_stats);
  // The combination runs on the host: on a device, over host copies of the statistics.
  const float* st = dev;
  float* lse = s.lse.f32();
  if (ctx_.device != Device::cpu) {
    host_ce_.resize(n_stats + n);  // grows to the largest micro-batch once
    ctx_.alloc->copy_to_host(host_ce_.data(), dev, sizeof(float) * n_stats);
    st = host_ce_.data();
    lse = host_ce_.data() + n_stats;
  }
  const float* mx = st;
  const float* se = st + static_cast<size_t>(tp) * n;
  const float* tgt = st + 2 * static_cast<size_t>(tp) * n;
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) {
    float m = mx[i];
    for (int q = 1; q < tp; ++q) m = std::max(m, mx[q * n + i]);
    double sum = 0.0;
    for (int q = 0; q < tp; ++q) sum += double(se[q * n + i]) * std::exp(double(mx[q * n + i]) - m);
    const double l = double(m) + std::log(sum);
    lse[i] = static_cast<float>(l);
    total += l - double(tgt[i]);
  }
  if (ctx_.device != Device::cpu) ctx_.alloc->copy_from_host(s.lse.data(), lse, sizeof(float) * n);
  return total;
}

void Stage::backward(int slot, const float* dout, float dloss, const ReadyFn& on_ready) {
  backward_pass(slot, dout, dloss, on_ready, /*split=*/false);
}

void Stage::backward_input(int slot, const float* dout, float dloss) {
  TROUPE_CHECK(!cfg_.recompute,
               "the split backward (zero-bubble schedules) needs every block's saved activations: "
               "train.recompute is not supported with it");
  backward_pass(slot, dout, dloss, {}, /*split=*/true);
}

void Stage::backward_pass(int slot, const float* dout, float dloss, const ReadyFn& on_ready, bool split) {
  Slot& s = slot_at(slot);
  // The lowest flat-gradient offset reported final so far.
  size_t ready = static_cast<size_t>(store_.flat_grads().numel());
  auto report = [&](size_t first) {
    if (on_ready && first < ready) on_ready(first, ready);
    ready = std::min(ready, first);
  };
  TROUPE_CHECK(s.forwarded, split ? "backward_input(" : "backward(", slot,
               ") without a forward of that slot");
  TROUPE_CHECK(!s.weights_pending, split ? "backward_input(" : "backward(", slot,
               ") while the slot's weight gradients are pending: backward_weights first");
  const int B = s.B, T = s.T, N = B * T, D = cfg_.d_model;
  const size_t nd = static_cast<size_t>(N) * D;
  float* dres = ws_.dres.f32();
  if (range_.has_head) {
    TROUPE_CHECK(s.has_targets, "backward through the head needs a forward with targets");
    const float* dlogits = head_output_grad(s, N, dloss);
    float* dlnf = ws_.tmp_d.f32();
    if (split)
      head_.backward_input(dlnf, dlogits, s.lnf, N, dlogits_h_, kernels::Out::overwrite);
    else
      head_.backward(dlnf, dlogits, s.lnf, N, dlogits_h_, kernels::Out::overwrite);
    ctx_.alloc->zero(dres, sizeof(float) * nd);
    if (cfg_.kind == ModelKind::llama) {
      // Each shard's dlnf is the part through its vocabulary rows; the sum is the whole.
      copy_to_tensor_region_backward(tp_, dlnf, nd);
      rms_f_.backward(dres, dlnf, s.resid.back().f32(), s.lnf_rstd.f32(), N);
    } else {
      ln_f_.backward(dres, dlnf, s.resid.back().f32(), s.lnf_mean.f32(), s.lnf_rstd.f32(), N);
    }
    // A full stage's wte (first in the buffer) still takes the embedding's gradient.
    report(head_begin_);
  } else {
    TROUPE_CHECK(dout != nullptr, "a stage without the head needs the gradient of its output");
    ctx_.alloc->copy_from_host(dres, dout, sizeof(float) * nd);
  }
  for (size_t b = blocks_.size(); b-- > 0;) {
    if (split) {
      blocks_[b]->backward_input(slot, dres, s.resid[b].f32(), B, T, ws_);
    } else if (cfg_.recompute) {
      // Re-run the block's forward from its saved input: its internals come back bit for
      // bit (the output rewrites resid[b+1] with the same values, no longer needed).
      blocks_[b]->forward(0, s.resid[b + 1].f32(), s.resid[b].f32(), B, T, ws_);
      blocks_[b]->backward(0, dres, s.resid[b].f32(), B, T, ws_);
    } else {
      blocks_[b]->backward(slot, dres, s.resid[b].f32(), B, T, ws_);
    }
    report(block_begin_[b]);
  }
  if (split) {
    s.weights_pending = true;
    s.dloss = dloss;
  }
  if (!range_.has_embedding) {
    ctx_.alloc->copy(s.dinput.data(), dres, sizeof(float) * nd);
  } else if (split && embedding_after_head()) {
    // wte takes the head's product before the embedding's rows in backward; W keeps that
    // order, so the rows wait for it (nothing waits for a first stage's B).
    if (!s.dembed.defined())
      s.dembed = Tensor::zeros({int64_t{max_B_} * cfg_.seq_len, D}, DType::f32, *ctx_.alloc);
    ctx_.alloc->copy(s.dembed.data(), dres, sizeof(float) * nd);
  } else {
    embedding_backward(s, dres);
  }
  report(0);
}

void Stage::backward_weights(int slot) {
  Slot& s = slot_at(slot);
  TROUPE_CHECK(s.weights_pending, "backward_weights(", slot, ") without a backward_input of that slot");
  const int B = s.B, T = s.T, N = B * T;
  // The same products in the same order as backward: the head, the blocks in reverse.
  if (range_.has_head) head_.backward_weight(head_output_grad(s, N, s.dloss), s.lnf, N, dlogits_h_);
  for (size_t b = blocks_.size(); b-- > 0;) blocks_[b]->backward_weights(slot, B, T, ws_);
  if (range_.has_embedding && embedding_after_head()) embedding_backward(s, s.dembed.f32());
  s.weights_pending = false;
}

size_t Stage::deferred_bytes() const {
  size_t n = 0;
  for (const auto& b : blocks_) n += b->deferred_bytes();
  for (const Slot& s : slots_) n += s.dembed.nbytes();
  return n;
}

const float* Stage::head_output_grad(Slot& s, int N, float dloss) {
  // dlogits is recomputed from the saved logits rather than kept per slot: (B,T,V) per
  // slot would dominate activation memory for a small D.
  float* dlogits = dlogits_.f32();
  if (cfg_.vocab_parallel()) {
    k_->cross_entropy_shard_backward(dlogits, s.logits.f32(), s.targets.i32(), s.lse.f32(), N, Vl_, v0_,
                                     dloss);
  } else {
    ctx_.alloc->zero(dlogits, sizeof(float) * static_cast<size_t>(N) * cfg_.vocab_size);
    k_->cross_entropy(dlogits, s.logits.f32(), s.targets.i32(), N, cfg_.vocab_size, dloss);
  }
  return dlogits;
}

void Stage::embedding_backward(const Slot& s, const float* dres) {
  const int N = s.B * s.T, D = cfg_.d_model;
  if (cfg_.vocab_parallel())
    k_->embedding_rows_backward(dwte_, dres, s.tokens.i32(), N, D, v0_, Vl_);  // dres is whole on every shard
  else
    k_->embedding_backward(dwte_, dwpe_, dres, s.tokens.i32(), s.B, s.T, D, cfg_.vocab_size);
}

Tensor Stage::output(int slot) const {
  TROUPE_CHECK(!range_.has_head, "a stage with the head has no output activations; use logits()");
  const Slot& s = slots_.at(static_cast<size_t>(slot));
  TROUPE_CHECK(s.forwarded, "output(", slot, ") before forward");
  return s.resid.back().slice(0, int64_t{s.B} * s.T).reshape({s.B, s.T, cfg_.d_model});
}

Tensor Stage::input_grad(int slot) const {
  TROUPE_CHECK(!range_.has_embedding, "the first stage has no input gradient");
  const Slot& s = slots_.at(static_cast<size_t>(slot));
  return s.dinput.slice(0, int64_t{s.B} * s.T).reshape({s.B, s.T, cfg_.d_model});
}

Tensor Stage::logits(int slot) const {
  TROUPE_CHECK(range_.has_head, "only the last stage has logits");
  const Slot& s = slots_.at(static_cast<size_t>(slot));
  TROUPE_CHECK(s.forwarded, "logits(", slot, ") before forward");
  return s.logits.slice(0, int64_t{s.B} * s.T).reshape({s.B, s.T, Vl_});
}

void Stage::last_logits(const int32_t* tokens, int T, float* out) {
  TROUPE_CHECK(range_.has_embedding && range_.has_head && Vl_ == cfg_.vocab_size,
               "last_logits needs the full model, with the whole vocabulary");
  forward(0, tokens, nullptr, nullptr, 1, T);
  const float* row = slots_[0].logits.f32() + static_cast<size_t>(T - 1) * cfg_.vocab_size;
  ctx_.alloc->copy_to_host(out, row, sizeof(float) * static_cast<size_t>(cfg_.vocab_size));
}

}  // namespace troupe::model
