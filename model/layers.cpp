#include "model/layers.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace troupe::model {
using kernels::Out;

namespace {
size_t sz(int64_t n) { return static_cast<size_t>(n); }
}  // namespace

Linear Linear::bind(ParamStore& ps, const std::string& prefix, const kernels::Kernels& k) {
  Param& w = ps.get(prefix + ".weight");
  Param* b = ps.contains(prefix + ".bias") ? &ps.get(prefix + ".bias") : nullptr;
  TROUPE_CHECK(w.data.ndim() == 2 && (!b || (b->data.ndim() == 1 && b->data.size(0) == w.data.size(0))),
               "bad linear parameters ", prefix);
  Linear l;
  l.k = &k;
  l.dt = w.compute.dtype();
  if (l.dt == DType::f32)
    l.w = w.compute.f32();
  else
    l.wh = w.compute.h16();
  l.dw = w.grad.f32();
  l.b = b ? b->data.f32() : nullptr;
  l.db = b ? b->grad.f32() : nullptr;
  l.out = static_cast<int>(w.data.size(0));
  l.in = static_cast<int>(w.data.size(1));
  return l;
}

void Linear::forward(float* y, const Tensor& x, int N, bool with_bias) const {
  TROUPE_CHECK(x.dtype() == dt && x.numel() >= int64_t{N} * in, "linear input of ", dtype_name(x.dtype()),
               " and ", x.numel(), " elements, expected ", dtype_name(dt), " and ", int64_t{N} * in);
  const float* bias = with_bias ? b : nullptr;  // b is null without a bias
  if (dt == DType::f32)
    k->linear_forward(y, x.f32(), w, bias, N, in, out);
  else
    k->linear_forward_h(dt, y, x.h16(), wh, bias, N, in, out);
}

namespace {

// The backward kernel call of `l` writing the gradients that are not null: dx (+)= dy @ W,
// dW += dy^T x, db += column sums of dy.
void linear_grads(const Linear& l, float* dx, float* dw, float* db, const float* dy, const Tensor& x, int N,
                  const Tensor& dy_h, Out dx_mode) {
  TROUPE_CHECK(x.dtype() == l.dt && x.numel() >= int64_t{N} * l.in, "linear input of ", dtype_name(x.dtype()),
               ", expected ", dtype_name(l.dt));
  if (l.dt == DType::f32) {
    l.k->linear_backward(dx, dw, db, dy, x.f32(), l.w, N, l.in, l.out, dx_mode);
    return;
  }
  TROUPE_CHECK(dy_h.dtype() == l.dt && dy_h.numel() >= int64_t{N} * l.out,
               "linear output-gradient scratch of ", dy_h.numel(), " ", dtype_name(dy_h.dtype()),
               ", expected ", int64_t{N} * l.out, " ", dtype_name(l.dt));
  l.k->linear_backward_h(l.dt, dx, dw, db, dy, dy_h.h16(), x.h16(), l.wh, N, l.in, l.out, dx_mode);
}

}  // namespace

void Linear::backward(float* dx, const float* dy, const Tensor& x, int N, const Tensor& dy_h,
                      Out dx_mode) const {
  linear_grads(*this, dx, dw, b ? db : nullptr, dy, x, N, dy_h, dx_mode);
}

void Linear::backward_input(float* dx, const float* dy, const Tensor& x, int N, const Tensor& dy_h,
                            Out dx_mode) const {
  linear_grads(*this, dx, nullptr, b ? db : nullptr, dy, x, N, dy_h, dx_mode);
}

void Linear::backward_weight(const float* dy, const Tensor& x, int N, const Tensor& dy_h) const {
  linear_grads(*this, nullptr, dw, nullptr, dy, x, N, dy_h, Out::accumulate);
}

KeptGrads::KeptGrads(std::vector<int> widths, int64_t max_N, Allocator& alloc)
    : widths_(std::move(widths)), max_N_(max_N), alloc_(&alloc) {}

std::vector<Tensor>& KeptGrads::at(int slot) {
  TROUPE_CHECK(slot >= 0 && alloc_ != nullptr, "kept gradients of slot ", slot, " of an unbound block");
  if (slots_.size() <= sz(slot)) slots_.resize(sz(slot) + 1);
  std::vector<Tensor>& dy = slots_[sz(slot)];
  if (dy.empty())
    for (int w : widths_) dy.push_back(Tensor::zeros({max_N_, w}, DType::f32, *alloc_));
  return dy;
}

size_t KeptGrads::bytes() const {
  size_t n = 0;
  for (const auto& dy : slots_)
    for (const Tensor& t : dy) n += t.nbytes();
  return n;
}

LayerNorm LayerNorm::bind(ParamStore& ps, const std::string& prefix, const kernels::Kernels& k) {
  Param& w = ps.get(prefix + ".weight");
  Param& b = ps.get(prefix + ".bias");
  LayerNorm l;
  l.k = &k;
  l.w = w.data.f32();
  l.dw = w.grad.f32();
  l.b = b.data.f32();
  l.db = b.grad.f32();
  l.C = static_cast<int>(w.data.size(0));
  return l;
}

void LayerNorm::forward(float* y, float* mean, float* rstd, const float* x, int N) const {
  k->layernorm_forward(y, mean, rstd, x, w, b, N, C);
}

void LayerNorm::backward(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                         int N) const {
  k->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
}

Workspace::Workspace(const ModelConfig& cfg, int max_B, const TensorShard& shard, Allocator& alloc,
                     DType compute_dtype) {
  const int64_t N = int64_t{max_B} * cfg.seq_len, D = cfg.d_model, H = shard.hidden(cfg);
  auto f32 = [&](Shape s) { return Tensor::zeros(std::move(s), DType::f32, alloc); };
  dres = f32({N, D});
  tmp_d = f32({N, D});
  dh = f32({N, H});
  // Widths of the column-parallel outputs: q|k|v and the MLP's first projection.
  int64_t qkv = 0, fc = H;
  if (cfg.kind != ModelKind::mlp) {
    qkv = int64_t{shard.n_head(cfg) + 2 * shard.n_kv_head(cfg)} * cfg.head_dim();
    dqkv = f32({N, qkv});
  }
  if (cfg.kind == ModelKind::llama) {
    fc = 2 * H;
    dgu = f32({N, fc});
  }
  if (compute_dtype != DType::f32) {
    const int64_t widest = std::max({qkv, fc, D});
    dy_h = Tensor::zeros({N * widest}, compute_dtype, alloc);
    if (qkv > 0) act = f32({N, qkv});  // q|k|v before they are kept
  }
}

namespace {

// Where c_attn writes q|k|v, which attention reads again in backward: the saved activation
// itself in f32; in mixed precision the f32 scratch ws.act (rope turns it there), which
// keep() then rounds into the saved activation. The norms and activations write their kept
// outputs in 16 bits directly (the kernels' _h forms).
float* staging(Tensor& saved, Workspace& ws) {
  return saved.dtype() == DType::f32 ? saved.f32() : ws.act.f32();
}
void keep(const kernels::Kernels& k, Tensor& saved, const float* staged, size_t n) {
  if (saved.dtype() != DType::f32) k.to_half(saved.dtype(), saved.h16(), staged, n);
}

// The fused attention on the saved q|k|v (N, (NH+2*NKV)*HS) of `qkv`'s dtype: out (N, NH*HS)
// in the same dtype, lse (B,NH,T).
void attention_forward(const kernels::Kernels& k, Tensor& out, Tensor& lse, const Tensor& qkv, int B, int T,
                       int NH, int HS, int NKV) {
  if (qkv.dtype() == DType::f32)
    k.attention_forward(out.f32(), lse.f32(), qkv.f32(), B, T, NH, HS, NKV);
  else
    k.attention_forward_h(qkv.dtype(), out.h16(), lse.f32(), qkv.h16(), B, T, NH, HS, NKV);
}

// dqkv (N, (NH+2*NKV)*HS) = the gradient of the q|k|v from dout (N, NH*HS), both f32.
void attention_backward(const kernels::Kernels& k, float* dqkv, const float* dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, int B, int T, int NH, int HS, int NKV) {
  if (qkv.dtype() == DType::f32)
    k.attention_backward(dqkv, dout, qkv.f32(), out.f32(), lse.f32(), B, T, NH, HS, Out::overwrite, NKV);
  else
    k.attention_backward_h(qkv.dtype(), dqkv, dout, qkv.h16(), out.h16(), lse.f32(), B, T, NH, HS,
                           Out::overwrite, NKV);
}

}  // namespace

void LayerNorm::forward(Tensor& y, float* mean, float* rstd, const float* x, int N) const {
  if (y.dtype() == DType::f32)
    forward(y.f32(), mean, rstd, x, N);
  else
    k->layernorm_forward_h(y.dtype(), y.h16(), mean, rstd, x, w, b, N, C);
}

namespace {

// y(N,out) = x(N,in) @ W^T + b for a row-parallel linear: each shard multiplies its
// columns of W by its part of x, the partial products are summed across shards, and
// the (replicated) bias is added once to the sum. tp = 1 is the plain Linear.
void row_parallel_forward(const Linear& l, const TensorGroup& tp, float* y, const Tensor& x, int N) {
  if (tp.size() == 1) {
    l.forward(y, x, N);
    return;
  }
  l.forward(y, x, N, /*with_bias=*/false);
  reduce_from_tensor_region_forward(tp, y, sz(int64_t{N} * l.out));
  if (l.b == nullptr) return;
  for (int n = 0; n < N; ++n) l.k->add_inplace(y + sz(int64_t{n} * l.out), l.b, sz(l.out));
}

// A Linear's backward inside a block (dx overwritten): the whole of it, or with `kept`
// the B half of a split backward, dy copied into kept for backward_weights' dW product.
void linear_backward(const Linear& l, float* dx, const float* dy, const Tensor& x, int N, Workspace& ws,
                     Tensor* kept) {
  if (kept == nullptr) {
    l.backward(dx, dy, x, N, ws.dy_h, Out::overwrite);
    return;
  }
  kept->slice(0, N).copy_from(
      Tensor::view_of(const_cast<float*>(dy), {N, l.out}, DType::f32, kept->device()));
  l.backward_input(dx, dy, x, N, ws.dy_h, Out::overwrite);
}

// The i-th kept buffer of a split backward's slot, or null in a whole backward.
Tensor* kept_at(std::vector<Tensor>* dy, size_t i) { return dy ? &(*dy)[i] : nullptr; }

}  // namespace

// ---------------------------------------------------------------- MLP sublayer

MlpSublayer::MlpSublayer(ParamStore& ps, const std::string& prefix, const ModelConfig& cfg, int n_slots,
                         int max_B, const TensorGroup& tp, const DeviceContext& ctx)
    : tp_(tp),
      k_(ctx.kernels),
      H_(static_cast<int>(tp.shard.hidden(cfg))),
      ln_2_(LayerNorm::bind(ps, prefix + ".ln_2", *ctx.kernels)),
      c_fc_(Linear::bind(ps, prefix + ".mlp.c_fc", *ctx.kernels)),
      c_proj_(Linear::bind(ps, prefix + ".mlp.c_proj", *ctx.kernels)),
      kept_({c_proj_.out, c_fc_.out}, int64_t{max_B} * cfg.seq_len, *ctx.alloc),
      acts_(std::make_shared<std::vector<Acts>>()) {
  const int64_t N = int64_t{max_B} * cfg.seq_len, D = cfg.d_model;
  TROUPE_CHECK(c_fc_.in == D && c_fc_.out == H_ && c_proj_.in == H_ && c_proj_.out == D, prefix,
               ": MLP shard shapes do not match hidden ", H_, " of tensor shard ", tp.shard.rank, "/",
               tp.size());
  auto f32 = [&](Shape s) { return Tensor::zeros(std::move(s), DType::f32, *ctx.alloc); };
  auto kept = [&](Shape s) { return Tensor::zeros(std::move(s), ctx.compute_dtype, *ctx.alloc); };
  for (int s = 0; s < n_slots; ++s) {
    Acts a;
    a.ln = kept({N, D});
    a.mean = f32({N});
    a.rstd = f32({N});
    a.h_pre = f32({N, H_});
    a.h = kept({N, H_});
    acts_->push_back(std::move(a));
  }
}

void MlpSublayer::forward(int slot, float* y, const float* x, int N, Workspace& ws) {
  Acts& a = acts_->at(static_cast<size_t>(slot));
  const int D = ln_2_.C;
  ln_2_.forward(a.ln, a.mean.f32(), a.rstd.f32(), x, N);
  copy_to_tensor_region_forward(tp_, a.ln);
  c_fc_.forward(a.h_pre.f32(), a.ln, N);
  if (a.h.dtype() == DType::f32)
    k_->gelu_forward(a.h.f32(), a.h_pre.f32(), sz(int64_t{N} * H_));
  else
    k_->gelu_forward_h(a.h.dtype(), a.h.h16(), a.h_pre.f32(), sz(int64_t{N} * H_));
  row_parallel_forward(c_proj_, tp_, ws.tmp_d.f32(), a.h, N);
  k_->residual_forward(y, x, ws.tmp_d.f32(), sz(int64_t{N} * D));
}

void MlpSublayer::backward(int slot, float* dres, const float* x, int N, Workspace& ws, bool split) {
  Acts& a = acts_->at(static_cast<size_t>(slot));
  std::vector<Tensor>* dy = split ? &kept_.at(slot) : nullptr;
  const int D = ln_2_.C;
  const int64_t nh = int64_t{N} * H_, nd = int64_t{N} * D;
  float* dh = ws.dh.f32();
  float* dln = ws.tmp_d.f32();
  // The residual path passes dres through unchanged; the branch adds into it via ln_2.
  reduce_from_tensor_region_backward(tp_, dres, sz(nd));
  linear_backward(c_proj_, dh, dres, a.h, N, ws, kept_at(dy, 0));
  k_->gelu_backward_inplace(dh, a.h_pre.f32(), sz(nh));
  linear_backward(c_fc_, dln, dh, a.ln, N, ws, kept_at(dy, 1));
  copy_to_tensor_region_backward(tp_, dln, sz(nd));
  ln_2_.backward(dres, dln, x, a.mean.f32(), a.rstd.f32(), N);
}

void MlpSublayer::backward_weights(int slot, int N, Workspace& ws) {
  Acts& a = acts_->at(static_cast<size_t>(slot));
  std::vector<Tensor>& dy = kept_.at(slot);
  c_proj_.backward_weight(dy[0].f32(), a.h, N, ws.dy_h);
  c_fc_.backward_weight(dy[1].f32(), a.ln, N, ws.dy_h);
}

// ---------------------------------------------------------------- GPT block

GptBlock::GptBlock(ParamStore& ps, int layer, const ModelConfig& cfg, int n_slots, int max_B,
                   const TensorGroup& tp, const DeviceContext& ctx)
    : tp_(tp),
      k_(ctx.kernels),
      D_(cfg.d_model),
      NH_(tp.shard.n_head(cfg)),
      HS_(cfg.head_dim()),
      ln_1_(LayerNorm::bind(ps, "h." + std::to_string(layer) + ".ln_1", *ctx.kernels)),
      c_attn_(Linear::bind(ps, "h." + std::to_string(layer) + ".attn.c_attn", *ctx.kernels)),
      c_proj_(Linear::bind(ps, "h." + std::to_string(layer) + ".attn.c_proj", *ctx.kernels)),
      kept_({c_proj_.out, c_attn_.out}, int64_t{max_B} * cfg.seq_len, *ctx.alloc),
      acts_(std::make_shared<std::vector<Acts>>()),
      mlp_(ps, "h." + std::to_string(layer), cfg, n_slots, max_B, tp, ctx) {
  const int64_t T = cfg.seq_len, N = int64_t{max_B} * T, D = D_, A = int64_t{NH_} * HS_;
  // The attention kernel takes the local head count; the head size stays D/NH.
  TROUPE_CHECK(c_attn_.in == D && c_attn_.out == 3 * A && c_proj_.in == A && c_proj_.out == D, "h.", layer,
               ": attention shard shapes do not match ", NH_, " heads of ", HS_, " on tensor shard ",
               tp.shard.rank, "/", tp.size());
  auto f32 = [&](Shape s) { return Tensor::zeros(std::move(s), DType::f32, *ctx.alloc); };
  auto kept = [&](Shape s) { return Tensor::zeros(std::move(s), ctx.compute_dtype, *ctx.alloc); };
  for (int s = 0; s < n_slots; ++s) {
    Acts a;
    a.ln = kept({N, D});
    a.mean = f32({N});
    a.rstd = f32({N});
    a.qkv = kept({N, 3 * A});
    a.lse = f32({int64_t{max_B}, NH_, T});
    a.atty = kept({N, A});
    a.mid = f32({N, D});
    acts_->push_back(std::move(a));
  }
}

void GptBlock::forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) {
  Acts& a = acts_->at(static_cast<size_t>(slot));
  const int N = B * T;
  ln_1_.forward(a.ln, a.mean.f32(), a.rstd.f32(), x, N);
  copy_to_tensor_region_forward(tp_, a.ln);
  float* qkv = staging(a.qkv, ws);
  c_attn_.forward(qkv, a.ln, N);
  keep(*k_, a.qkv, qkv, sz(int64_t{N} * 3 * NH_ * HS_));
  attention_forward(*k_, a.atty, a.lse, a.qkv, B, T, NH_, HS_, NH_);
  row_parallel_forward(c_proj_, tp_, ws.tmp_d.f32(), a.atty, N);
  k_->residual_forward(a.mid.f32(), x, ws.tmp_d.f32(), sz(int64_t{N} * D_));
  mlp_.forward(slot, y, a.mid.f32(), N, ws);
}

void GptBlock::backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) {
  backward_pass(slot, dres, x, B, T, ws, false);
}

void GptBlock::backward_input(int slot, float* dres, const float* x, int B, int T, Workspace& ws) {
  backward_pass(slot, dres, x, B, T, ws, true);
}

void GptBlock::backward_pass(int slot, float* dres, const float* x, int B, int T, Workspace& ws, bool split) {
  Acts& a = acts_->at(static_cast<size_t>(slot));
  std::vector<Tensor>* dy = split ? &kept_.at(slot) : nullptr;
  const int N = B * T;
  const int64_t nd = int64_t{N} * D_, na = int64_t{N} * NH_ * HS_;
  mlp_.backward(slot, dres, a.mid.f32(), N, ws, split);
  reduce_from_tensor_region_backward(tp_, dres, sz(nd));
  float* dtmp = ws.tmp_d.f32();
  linear_backward(c_proj_, dtmp, dres, a.atty, N, ws, kept_at(dy, 0));  // datty (N, NH_*HS_)
  float* dqkv = ws.dqkv.f32();
  attention_backward(*k_, dqkv, dtmp, a.qkv, a.atty, a.lse, B, T, NH_, HS_, NH_);
  linear_backward(c_attn_, dtmp, dqkv, a.ln, N, ws, kept_at(dy, 1));  // dln_1
  // The key bias shifts every score of a query by the same amount, which softmax
  // ignores: its gradient is exactly zero. Computed, it is rounding noise that AdamW
  // (dividing by its own running size) would turn into steps of size lr, different in
  // every layout. Keep it at its true value.
  Tensor::view_of(c_attn_.db + na / N, {na / N}, DType::f32, k_->device).zero_();
  copy_to_tensor_region_backward(tp_, dtmp, sz(nd));
  ln_1_.backward(dres, dtmp, x, a.mean.f32(), a.rstd.f32(), N);
}

void GptBlock::backward_weights(int slot, int B, int T, Workspace& ws) {
  Acts& a = acts_->at(static_cast<size_t>(slot));
  std::vector<Tensor>& dy = kept_.at(slot);
  const int N = B * T;
  mlp_.backward_weights(slot, N, ws);
  c_proj_.backward_weight(dy[0].f32(), a.atty, N, ws.dy_h);
  c_attn_.backward_weight(dy[1].f32(), a.ln, N, ws.dy_h);
}

size_t GptBlock::deferred_bytes() const { return kept_.bytes() + mlp_.deferred_bytes(); }

void GptBlock::share_activations(Block& owner) {
  auto& o = dynamic_cast<GptBlock&>(owner);
  acts_ = o.acts_;
  mlp_.share_activations(o.mlp_);
}

// ---------------------------------------------------------------- RMSNorm

RmsNorm RmsNorm::bind(ParamStore& ps, const std::string& prefix, const kernels::Kernels& k, float eps) {
  Param& w = ps.get(prefix + ".weight");
  RmsNorm l;
  l.k = &k;
  l.w = w.data.f32();
  l.dw = w.grad.f32();
  l.C = static_cast<int>(w.data.size(0));
  l.eps = eps;
  return l;
}

void RmsNorm::forward(Tensor& y, float* rstd, const float* x, int N) const {
  if (y.dtype() == DType::f32)
    k->rmsnorm_forward(y.f32(), rstd, x, w, N, C, eps);
  else
    k->rmsnorm_forward_h(y.dtype(), y.h16(), rstd, x, w, N, C, eps);
}

void RmsNorm::backward(float* dx, const float* dy, const float* x, const float* rstd, int N) const {
  k->rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
}

// ---------------------------------------------------------------- llama block

LlamaBlock::LlamaBlock(ParamStore& ps, int layer, const ModelConfig& cfg, int n_slots, int max_B,
                       const TensorGroup& tp, const DeviceContext& ctx)
    : tp_(tp),
      k_(ctx.kernels),
      D_(cfg.d_model),
      NH_(tp.shard.n_head(cfg)),
      NKV_(tp.shard.n_kv_head(cfg)),
      HS_(cfg.head_dim()),
      F_(static_cast<int>(tp.shard.hidden(cfg))),
      inv_freq_(rope_inv_freq(cfg.head_dim(), cfg.rope_theta, cfg.rope_scaling)),
      acts_(std::make_shared<std::vector<Acts>>()) {
  const std::string h = "h." + std::to_string(layer);
  ln_1_ = RmsNorm::bind(ps, h + ".ln_1", *k_, cfg.norm_eps);
  ln_2_ = RmsNorm::bind(ps, h + ".ln_2", *k_, cfg.norm_eps);
  c_attn_ = Linear::bind(ps, h + ".attn.c_attn", *k_);
  c_proj_ = Linear::bind(ps, h + ".attn.c_proj", *k_);
  c_fc_ = Linear::bind(ps, h + ".mlp.c_fc", *k_);
  c_down_ = Linear::bind(ps, h + ".mlp.c_proj", *k_);
  kept_ =
      KeptGrads({c_down_.out, c_fc_.out, c_proj_.out, c_attn_.out}, int64_t{max_B} * cfg.seq_len, *ctx.alloc);
  const int64_t T = cfg.seq_len, N = int64_t{max_B} * T, D = D_, A = int64_t{NH_} * HS_,
                QKV = int64_t{NH_ + 2 * NKV_} * HS_;
  TROUPE_CHECK(c_attn_.in == D && c_attn_.out == QKV && c_proj_.in == A && c_proj_.out == D &&
                   c_fc_.in == D && c_fc_.out == 2 * F_ && c_down_.in == F_ && c_down_.out == D,
               h, ": llama shard shapes do not match ", NH_, " heads, ", NKV_, " kv heads of ", HS_, " and ",
               F_, " hidden units on tensor shard ", tp.shard.rank, "/", tp.size());
  auto f32 = [&](Shape s) { return Tensor::zeros(std::move(s), DType::f32, *ctx.alloc); };
  auto kept = [&](Shape s) { return Tensor::zeros(std::move(s), ctx.compute_dtype, *ctx.alloc); };
  for (int s = 0; s < n_slots; ++s) {
    Acts a;
    a.ln1 = kept({N, D});
    a.rstd1 = f32({N});
    a.qkv = kept({N, QKV});
    a.lse = f32({int64_t{max_B}, NH_, T});
    a.atty = kept({N, A});
    a.mid = f32({N, D});
    a.ln2 = kept({N, D});
    a.rstd2 = f32({N});
    a.gu = f32({N, 2 * int64_t{F_}});
    a.h = kept({N, F_});
    acts_->push_back(std::move(a));
  }
}

void LlamaBlock::forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) {
  Acts& a = acts_->at(static_cast<size_t>(slot));
  const int N = B * T, ld = (NH_ + 2 * NKV_) * HS_;
  ln_1_.forward(a.ln1, a.rstd1.f32(), x, N);
  copy_to_tensor_region_forward(tp_, a.ln1);
  float* qkv = staging(a.qkv, ws);
  c_attn_.forward(qkv, a.ln1, N);
  k_->rope_forward(qkv, B, T, NH_ + NKV_, HS_, ld, inv_freq_.data());  // q and k heads lead each row
  keep(*k_, a.qkv, qkv, sz(int64_t{N} * ld));
  attention_forward(*k_, a.atty, a.lse, a.qkv, B, T, NH_, HS_, NKV_);
  row_parallel_forward(c_proj_, tp_, ws.tmp_d.f32(), a.atty, N);
  k_->residual_forward(a.mid.f32(), x, ws.tmp_d.f32(), sz(int64_t{N} * D_));
  ln_2_.forward(a.ln2, a.rstd2.f32(), a.mid.f32(), N);
  copy_to_tensor_region_forward(tp_, a.ln2);
  c_fc_.forward(a.gu.f32(), a.ln2, N);
  if (a.h.dtype() == DType::f32)
    k_->swiglu_forward(a.h.f32(), a.gu.f32(), N, F_);
  else
    k_->swiglu_forward_h(a.h.dtype(), a.h.h16(), a.gu.f32(), N, F_);
  row_parallel_forward(c_down_, tp_, ws.tmp_d.f32(), a.h, N);
  k_->residual_forward(y, a.mid.f32(), ws.tmp_d.f32(), sz(int64_t{N} * D_));
}

void LlamaBlock::backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) {
  backward_pass(slot, dres, x, B, T, ws, false);
}

void LlamaBlock::backward_input(int slot, float* dres, const float* x, int B, int T, Workspace& ws) {
  backward_pass(slot, dres, x, B, T, ws, true);
}

void LlamaBlock::backward_pass(int slot, float* dres, const float* x, int B, int T, Workspace& ws,
                               bool split) {
  Acts& a = acts_->at(static_cast<size_t>(slot));
  std::vector<Tensor>* dy = split ? &kept_.at(slot) : nullptr;
  const int N = B * T, ld = (NH_ + 2 * NKV_) * HS_;
  const size_t nd = sz(int64_t{N} * D_);
  float* dtmp = ws.tmp_d.f32();
  // MLP: dres = dL/dy on entry, dL/dmid after ln_2's backward adds the branch.
  reduce_from_tensor_region_backward(tp_, dres, nd);
  linear_backward(c_down_, ws.dh.f32(), dres, a.h, N, ws, kept_at(dy, 0));
  k_->swiglu_backward(ws.dgu.f32(), ws.dh.f32(), a.gu.f32(), N, F_);
  linear_backward(c_fc_, dtmp, ws.dgu.f32(), a.ln2, N, ws, kept_at(dy, 1));
  copy_to_tensor_region_backward(tp_, dtmp, nd);
  ln_2_.backward(dres, dtmp, a.mid.f32(), a.rstd2.f32(), N);
  // Attention: dres = dL/dmid on entry, dL/dx on return.
  reduce_from_tensor_region_backward(tp_, dres, nd);
  linear_backward(c_proj_, dtmp, dres, a.atty, N, ws, kept_at(dy, 2));  // datty (N, NH_*HS)
  float* dqkv = ws.dqkv.f32();
  attention_backward(*k_, dqkv, dtmp, a.qkv, a.atty, a.lse, B, T, NH_, HS_, NKV_);
  k_->rope_backward(dqkv, B, T, NH_ + NKV_, HS_, ld, inv_freq_.data());
  linear_backward(c_attn_, dtmp, dqkv, a.ln1, N, ws, kept_at(dy, 3));  // dln_1
  copy_to_tensor_region_backward(tp_, dtmp, nd);
  ln_1_.backward(dres, dtmp, x, a.rstd1.f32(), N);
}

void LlamaBlock::backward_weights(int slot, int B, int T, Workspace& ws) {
  Acts& a = acts_->at(static_cast<size_t>(slot));
  std::vector<Tensor>& dy = kept_.at(slot);
  const int N = B * T;
  c_down_.backward_weight(dy[0].f32(), a.h, N, ws.dy_h);
  c_fc_.backward_weight(dy[1].f32(), a.ln2, N, ws.dy_h);
  c_proj_.backward_weight(dy[2].f32(), a.atty, N, ws.dy_h);
  c_attn_.backward_weight(dy[3].f32(), a.ln1, N, ws.dy_h);
}

size_t LlamaBlock::deferred_bytes() const { return kept_.bytes(); }

void LlamaBlock::share_activations(Block& owner) { acts_ = dynamic_cast<LlamaBlock&>(owner).acts_; }

// ---------------------------------------------------------------- MLP block

MlpBlock::MlpBlock(ParamStore& ps, int layer, const ModelConfig& cfg, int n_slots, int max_B,
                   const TensorGroup& tp, const DeviceContext& ctx)
    : mlp_(ps, "h." + std::to_string(layer), cfg, n_slots, max_B, tp, ctx) {}

void MlpBlock::forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) {
  mlp_.forward(slot, y, x, B * T, ws);
}

void MlpBlock::backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) {
  mlp_.backward(slot, dres, x, B * T, ws);
}

void MlpBlock::backward_input(int slot, float* dres, const float* x, int B, int T, Workspace& ws) {
  mlp_.backward(slot, dres, x, B * T, ws, /*split=*/true);
}

void MlpBlock::backward_weights(int slot, int B, int T, Workspace& ws) {
  mlp_.backward_weights(slot, B * T, ws);
}

size_t MlpBlock::deferred_bytes() const { return mlp_.deferred_bytes(); }

void MlpBlock::share_activations(Block& owner) {
  mlp_.share_activations(dynamic_cast<MlpBlock&>(owner).mlp_);
}

}  // namespace troupe::model
