// Layers with explicit forward and backward over a kernel table (kernels/kernels.hpp,
// from the stage's DeviceContext; the fp32 CPU kernels in this build).
//
// A layer does not own parameters: it points into a stage's ParamStore and
// accumulates into the f32 grads. What it reads follows torch.autocast with f32
// master weights: a Linear's product reads the weights' compute copy
// (Param::compute: the f32 master itself in f32; bf16 or f16 in mixed precision),
// and LayerNorm, embeddings, biases, attention, GELU and the loss read and compute
// in f32. In mixed precision the activations a product reads in backward (the
// inputs of every Linear) are kept in the compute dtype, the rest in f32. A block
// owns its activations, one set per micro-batch slot, allocated once for the
// largest (B, T) so a pipeline schedule can keep several micro-batches in flight.
// Backward scratch is shared (one backward runs at a time) in a Workspace.
// All backward passes ACCUMULATE parameter gradients (kernel convention).
//
// A block's backward can also run split in two (zero-bubble pipeline schedules):
// backward_input is backward without the Linear weight-gradient products dW += dy^T x,
// keeping each Linear's dy (f32) in the slot; backward_weights(slot) makes those products
// later, with the same kernel calls, so the two halves leave the grads backward would.
//
// With tensor parallelism (TensorGroup of size tp > 1) a block holds its shard's
// parameters (model/params.hpp): attention over NH/tp heads and an MLP hidden of 4D/tp,
// with the communication pairs of model/tensor_parallel.hpp around them. Activations
// entering and leaving a block are whole (N,D) on every shard.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"
#include "model/config.hpp"
#include "model/device_context.hpp"
#include "model/params.hpp"
#include "model/tensor_parallel.hpp"

namespace troupe::model {

// y(N,out) = x(N,in) @ W(out,in)^T + b(out).
//
// In f32 the product reads the f32 weights; in mixed precision (a bf16 or f16
// compute dtype) it reads the weights' compute copy (Param::compute) and an input
// kept in that dtype, accumulating in f32 (kernels' linear_*_h). The bias, the
// output and every gradient stay f32.
struct Linear {
  const kernels::Kernels* k = nullptr;
  DType dt = DType::f32;         // dtype of the weights and inputs the product reads
  const float* w = nullptr;      // f32 weights (dt == f32)
  const uint16_t* wh = nullptr;  // 16-bit weights (dt bf16 / f16)
  float* dw = nullptr;
  const float* b = nullptr;  // may be null (tied LM head, llama)
  float* db = nullptr;
  int in = 0, out = 0;

  // prefix.weight and, when the store has it, prefix.bias
  static Linear bind(ParamStore& ps, const std::string& prefix, const kernels::Kernels& k);
  // x: (>= N, in) of dtype dt. with_bias = false leaves the bias out (row-parallel shards).
  void forward(float* y, const Tensor& x, int N, bool with_bias = true) const;
  // dx(N,in) += dy @ W (= with Out::overwrite; dx may be null); dW, db +=. dy_h: (N,out)
  // scratch of dtype dt that dy is rounded into (unused with f32).
  void backward(float* dx, const float* dy, const Tensor& x, int N, const Tensor& dy_h,
                kernels::Out dx_mode = kernels::Out::accumulate) const;
  // The two halves of backward: dx and db without dW, then dW += dy^T x alone. Each is the
  // same kernel call as backward's with the other outputs left out (in mixed precision both
  // round the f32 dy into dy_h, to the same bits), so together they leave backward's bits.
  void backward_input(float* dx, const float* dy, const Tensor& x, int N, const Tensor& dy_h,
                      kernels::Out dx_mode = kernels::Out::accumulate) const;
  void backward_weight(const float* dy, const Tensor& x, int N, const Tensor& dy_h) const;
};

// The output gradients of a block's Linears kept between the two halves of a split
// backward: per slot, one f32 (max N, out) buffer per Linear, allocated from `alloc` on
// the slot's first backward_input (a schedule without the split pays nothing).
class KeptGrads {
 public:
  KeptGrads() = default;
  KeptGrads(std::vector<int> widths, int64_t max_N, Allocator& alloc);
  // The slot's buffers, in the order of `widths`.
  std::vector<Tensor>& at(int slot);
  size_t bytes() const;

 private:
  std::vector<int> widths_;
  int64_t max_N_ = 0;
  Allocator* alloc_ = nullptr;
  std::vector<std::vector<Tensor>> slots_;  // empty until a slot's first use
};

struct Workspace;

// Per-row LayerNorm over C with affine weight/bias; eps = 1e-5.
struct LayerNorm {
  const kernels::Kernels* k = nullptr;
  const float* w = nullptr;
  float* dw = nullptr;
  const float* b = nullptr;
  float* db = nullptr;
  int C = 0;

  static LayerNorm bind(ParamStore& ps, const std::string& prefix, const kernels::Kernels& k);
  void forward(float* y, float* mean, float* rstd, const float* x, int N) const;
  // y (>= N rows) in its own dtype: f32, or bf16 / f16 rounded as it is made (a linear's kept
  // input in mixed precision).
  void forward(Tensor& y, float* mean, float* rstd, const float* x, int N) const;
  void backward(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                int N) const;
};

// Per-row RMSNorm over C with a weight and no bias (llama): y = x / sqrt(mean(x^2) + eps) * w.
struct RmsNorm {
  const kernels::Kernels* k = nullptr;
  const float* w = nullptr;
  float* dw = nullptr;
  int C = 0;
  float eps = 1e-5f;

  static RmsNorm bind(ParamStore& ps, const std::string& prefix, const kernels::Kernels& k, float eps);
  // y (>= N rows) in its own dtype, as LayerNorm::forward; rstd(N) saved for backward.
  void forward(Tensor& y, float* rstd, const float* x, int N) const;
  void backward(float* dx, const float* dy, const float* x, const float* rstd, int N) const;  // dx +=
};

// Backward scratch shared by the blocks of one stage, sized for the largest micro-batch.
struct Workspace {
  Workspace() = default;
  // Sized for tensor shard `shard`: H = 4D/tp hidden units, NH/tp heads; from `alloc`.
  Workspace(const ModelConfig& cfg, int max_B, const TensorShard& shard = {},
            Allocator& alloc = cpu_allocator(), DType compute_dtype = DType::f32);
  Tensor dres;   // (B,T,D)  gradient flowing down the residual stream
  Tensor tmp_d;  // (B,T,D)  forward projection outputs; backward dln / datty
  Tensor dqkv;   // (B,T,3D/tp); llama (B,T,(NH+2*NKV)*HS/tp)
  Tensor dh;     // (B,T,H) gradient wrt the MLP hidden, after GELU, then (in place) before it
  Tensor dgu;    // (B,T,2H) llama: gradient wrt the fused gate|up projection's output
  // Mixed precision only (compute dtype bf16 / f16; undefined in f32):
  Tensor dy_h;  // (B*T*max(q|k|v width, MLP projection width, D)) a linear's output gradient, compute dtype
  Tensor act;   // (B,T,q|k|v width) f32 q|k|v before they are kept in the compute dtype (attention models)
};

class Block {
 public:
  virtual ~Block() = default;
  // y(B,T,D) = block(x(B,T,D)); saves what backward needs in `slot`. x must stay
  // unchanged until backward(slot) has run (it is the stage's residual buffer).
  virtual void forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) = 0;
  // dres(B,T,D): on entry dL/dy, on return dL/dx (updated in place). Parameter grads +=.
  virtual void backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) = 0;
  // The split backward: backward_input is backward (the same dres, communication and
  // grads) except the Linears' dW, whose dy it keeps in the slot; backward_weights adds
  // those dW. The slot's activations must stay as forward left them in between.
  virtual void backward_input(int slot, float* dres, const float* x, int B, int T, Workspace& ws) = 0;
  virtual void backward_weights(int slot, int B, int T, Workspace& ws) = 0;
  virtual size_t deferred_bytes() const = 0;  // of the kept dy buffers
  // From now on keep internal activations in `owner`'s buffers (a block of the same kind
  // and shape): activation recomputation, where only one block's internals live at a time.
  virtual void share_activations(Block& owner) = 0;
};

// x + MLP(ln_2(x)), MLP = c_proj(gelu(c_fc(.))), hidden 4D. Used by both models.
// Tensor-parallel: c_fc column-parallel (H = 4D/tp hidden units per shard), c_proj
// row-parallel with its bias added once after the reduction.
class MlpSublayer {
 public:
  MlpSublayer(ParamStore& ps, const std::string& prefix, const ModelConfig& cfg, int n_slots, int max_B,
              const TensorGroup& tp = {}, const DeviceContext& ctx = DeviceContext::cpu());
  void forward(int slot, float* y, const float* x, int N, Workspace& ws);
  // split: the B half of a split backward (Block::backward_input), else the whole backward.
  void backward(int slot, float* dres, const float* x, int N, Workspace& ws, bool split = false);
  void backward_weights(int slot, int N, Workspace& ws);
  size_t deferred_bytes() const { return kept_.bytes(); }
  void share_activations(MlpSublayer& owner) { acts_ = owner.acts_; }

 private:
  TensorGroup tp_;
  const kernels::Kernels* k_;
  int H_;  // local hidden units
  LayerNorm ln_2_;
  Linear c_fc_, c_proj_;
  KeptGrads kept_;  // dy of c_proj, c_fc
  struct Acts {
    Tensor ln, mean, rstd;  // (N,D) in the compute dtype, (N), (N)
    Tensor h_pre, h;        // (N,H) before (f32) and after GELU (compute dtype)
  };
  std::shared_ptr<std::vector<Acts>> acts_;  // per slot; shared between blocks under recomputation
};

// Pre-LN transformer block: x + attn(ln_1(x)), then + MLP(ln_2(.)).
// Tensor-parallel: c_attn column-parallel (this shard's heads' q|k|v), attention over
// NH/tp heads of head_dim D/NH, c_proj row-parallel.
class GptBlock : public Block {
 public:
  GptBlock(ParamStore& ps, int layer, const ModelConfig& cfg, int n_slots, int max_B,
           const TensorGroup& tp = {}, const DeviceContext& ctx = DeviceContext::cpu());
  void forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) override;
  void backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) override;
  void backward_input(int slot, float* dres, const float* x, int B, int T, Workspace& ws) override;
  void backward_weights(int slot, int B, int T, Workspace& ws) override;
  size_t deferred_bytes() const override;
  void share_activations(Block& owner) override;

 private:
  TensorGroup tp_;
  const kernels::Kernels* k_;
  int D_, NH_, HS_;  // NH_: local heads (NH/tp); HS_ = D/NH
  LayerNorm ln_1_;
  Linear c_attn_, c_proj_;
  KeptGrads kept_;  // dy of c_proj, c_attn (the MLP sublayer keeps its own)
  struct Acts {
    Tensor ln, mean, rstd;  // (N,D) in the compute dtype, (N), (N)
    Tensor qkv;   // (N,3*NH_*HS_) q|k|v of the local heads, heads contiguous inside each (compute dtype)
    Tensor lse;   // (B,NH_,T) each query's log-sum-exp: all the fused attention keeps
    Tensor atty;  // (N,NH_*HS_) attention output before c_proj (compute dtype)
    Tensor mid;   // (N,D) x + attention branch = input of the MLP sublayer
  };
  std::shared_ptr<std::vector<Acts>> acts_;  // per slot; shared between blocks under recomputation
  MlpSublayer mlp_;

  // backward, or with split backward_input: one code path for both.
  void backward_pass(int slot, float* dres, const float* x, int B, int T, Workspace& ws, bool split);
};

// Llama block: h = x + o_proj(attn(rope(q|k|v(rms_1(x))))), y = h + down(silu(gate) * up)
// with gate|up = c_fc(rms_2(h)). Grouped-query attention over NKV key/value heads.
// Tensor-parallel: c_attn column-parallel over this shard's NH/tp query and NKV/tp
// key/value heads, c_fc column-parallel over its F/tp gate and up units, both c_proj
// row-parallel. No biases.
class LlamaBlock : public Block {
 public:
  LlamaBlock(ParamStore& ps, int layer, const ModelConfig& cfg, int n_slots, int max_B,
             const TensorGroup& tp = {}, const DeviceContext& ctx = DeviceContext::cpu());
  void forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) override;
  void backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) override;
  void backward_input(int slot, float* dres, const float* x, int B, int T, Workspace& ws) override;
  void backward_weights(int slot, int B, int T, Workspace& ws) override;
  size_t deferred_bytes() const override;
  void share_activations(Block& owner) override;

 private:
  TensorGroup tp_;
  const kernels::Kernels* k_;
  int D_, NH_, NKV_, HS_, F_;    // local heads, kv heads and hidden units; HS = D/NH
  std::vector<float> inv_freq_;  // (HS/2) rope_inv_freq of the model's theta and scaling
  RmsNorm ln_1_, ln_2_;
  Linear c_attn_, c_proj_, c_fc_, c_down_;
  KeptGrads kept_;  // dy of c_down, c_fc, c_proj, c_attn
  struct Acts {
    Tensor ln1, rstd1;  // (N,D) in the compute dtype, (N)
    Tensor qkv;         // (N,(NH_+2*NKV_)*HS) after the rotary embedding of q and k (compute dtype)
    Tensor lse;         // (B,NH_,T) each query's log-sum-exp
    Tensor atty;        // (N,NH_*HS) attention output (compute dtype)
    Tensor mid;         // (N,D) x + attention branch
    Tensor ln2, rstd2;  // (N,D) compute dtype, (N)
    Tensor gu;          // (N,2*F_) gate|up (f32)
    Tensor h;           // (N,F_) silu(gate) * up (compute dtype)
  };
  std::shared_ptr<std::vector<Acts>> acts_;  // per slot; shared between blocks under recomputation

  // backward, or with split backward_input: one code path for both.
  void backward_pass(int slot, float* dres, const float* x, int B, int T, Workspace& ws, bool split);
};

// Residual MLP block of the MLP model: x + MLP(ln_2(x)).
class MlpBlock : public Block {
 public:
  MlpBlock(ParamStore& ps, int layer, const ModelConfig& cfg, int n_slots, int max_B,
           const TensorGroup& tp = {}, const DeviceContext& ctx = DeviceContext::cpu());
  void forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) override;
  void backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) override;
  void backward_input(int slot, float* dres, const float* x, int B, int T, Workspace& ws) override;
  void backward_weights(int slot, int B, int T, Workspace& ws) override;
  size_t deferred_bytes() const override;
  void share_activations(Block& owner) override;

 private:
  MlpSublayer mlp_;
};

}  // namespace troupe::model
