// Layers with explicit forward and backward over the CPU kernels.
//
// A layer does not own parameters: it points into a stage's ParamStore. A block
// owns its activations, one set per micro-batch slot, allocated once for the
// largest (B, T) so a pipeline schedule can keep several micro-batches in flight.
// Backward scratch is shared (one backward runs at a time) in a Workspace.
// All backward passes ACCUMULATE parameter gradients (kernel convention).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "model/config.hpp"
#include "model/params.hpp"

namespace troupe::model {

// y(N,out) = x(N,in) @ W(out,in)^T + b(out).
struct Linear {
  const float* w = nullptr;
  float* dw = nullptr;
  const float* b = nullptr;  // may be null (tied LM head)
  float* db = nullptr;
  int in = 0, out = 0;

  static Linear bind(ParamStore& ps, const std::string& prefix);  // prefix.weight, prefix.bias
  void forward(float* y, const float* x, int N) const;
  // dx(N,in) += dy @ W (dx may be null); dW, db +=.
  void backward(float* dx, const float* dy, const float* x, int N) const;
};

// Per-row LayerNorm over C with affine weight/bias; eps = 1e-5.
struct LayerNorm {
  const float* w = nullptr;
  float* dw = nullptr;
  const float* b = nullptr;
  float* db = nullptr;
  int C = 0;

  static LayerNorm bind(ParamStore& ps, const std::string& prefix);
  void forward(float* y, float* mean, float* rstd, const float* x, int N) const;
  void backward(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                int N) const;
};

// Backward scratch shared by the blocks of one stage, sized for the largest micro-batch.
struct Workspace {
  Workspace() = default;
  Workspace(const ModelConfig& cfg, int max_B);
  Tensor dres;    // (B,T,D)  gradient flowing down the residual stream
  Tensor tmp_d;   // (B,T,D)  forward projection outputs; backward dln / datty
  Tensor dqkv;    // (B,T,3D)
  Tensor dh;      // (B,T,4D) gradient wrt the MLP hidden, after GELU
  Tensor dh_pre;  // (B,T,4D) gradient wrt the MLP hidden, before GELU
  Tensor datt;    // (B,NH,T,T) attention backward scratch (gpt)
};

class Block {
 public:
  virtual ~Block() = default;
  // y(B,T,D) = block(x(B,T,D)); saves what backward needs in `slot`. x must stay
  // unchanged until backward(slot) has run (it is the stage's residual buffer).
  virtual void forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) = 0;
  // dres(B,T,D): on entry dL/dy, on return dL/dx (updated in place). Parameter grads +=.
  virtual void backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) = 0;
};

// x + MLP(ln_2(x)), MLP = c_proj(gelu(c_fc(.))), hidden 4D. Used by both models.
class MlpSublayer {
 public:
  MlpSublayer(ParamStore& ps, const std::string& prefix, const ModelConfig& cfg, int n_slots, int max_B);
  void forward(int slot, float* y, const float* x, int N, Workspace& ws);
  void backward(int slot, float* dres, const float* x, int N, Workspace& ws);

 private:
  LayerNorm ln_2_;
  Linear c_fc_, c_proj_;
  struct Acts {
    Tensor ln, mean, rstd;  // (N,D), (N), (N)
    Tensor h_pre, h;        // (N,4D) before and after GELU
  };
  std::vector<Acts> acts_;
};

// Pre-LN transformer block: x + attn(ln_1(x)), then + MLP(ln_2(.)).
class GptBlock : public Block {
 public:
  GptBlock(ParamStore& ps, int layer, const ModelConfig& cfg, int n_slots, int max_B);
  void forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) override;
  void backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) override;

 private:
  int D_, NH_;
  LayerNorm ln_1_;
  Linear c_attn_, c_proj_;
  struct Acts {
    Tensor ln, mean, rstd;  // (N,D), (N), (N)
    Tensor qkv;             // (N,3D) rows q|k|v, heads contiguous inside each
    Tensor att;             // (B,NH,T,T) softmax probabilities
    Tensor atty;            // (N,D) attention output before c_proj
    Tensor mid;             // (N,D) x + attention branch = input of the MLP sublayer
  };
  std::vector<Acts> acts_;
  MlpSublayer mlp_;
};

// Residual MLP block of the MLP model: x + MLP(ln_2(x)).
class MlpBlock : public Block {
 public:
  MlpBlock(ParamStore& ps, int layer, const ModelConfig& cfg, int n_slots, int max_B);
  void forward(int slot, float* y, const float* x, int B, int T, Workspace& ws) override;
  void backward(int slot, float* dres, const float* x, int B, int T, Workspace& ws) override;

 private:
  MlpSublayer mlp_;
};

}  // namespace troupe::model
