// AdamW over a rank's parameter slices, the learning-rate schedule and
// global-norm gradient clipping.
//
// The optimizer sees only flat float buffers (ParamRef): which slice of which
// tensor a rank holds is the model's business. Moments m and v are owned here,
// one buffer per parameter, in the same order, so a checkpoint can name them
// "optim.m.<param>" / "optim.v.<param>".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.hpp"
#include "core/spec.hpp"
#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace troupe {

struct ParamRef {
  std::string name;
  float* data = nullptr;
  float* grad = nullptr;
  size_t numel = 0;
  bool decay = true;  // weight decay applies (2-D weights and embeddings, as PyTorch's AdamW groups do)
};

// Learning rate of optimizer step `step` (0-based): linear warm-up over
// train.warmup_steps from lr/warmup to lr, then constant, cosine or linear decay to
// train.min_lr at train.steps.
double lr_at(const TrainSpec& train, int64_t step);

// The update runs through a kernel table (the stage's: kernels/kernels.hpp) on the device
// its parameters live on; the moments come from `alloc`, that device's allocator (f32,
// zero at the start). On a device, m(i) and v(i) are device tensors.
class AdamW {
 public:
  AdamW(const OptimizerSpec& spec, std::vector<ParamRef> params,
        const kernels::Kernels& k = kernels::cpu_kernels(), Allocator& alloc = cpu_allocator());

  // One update with learning rate lr; t is the 1-based count of updates so far
  // including this one (bias correction).
  void step(double lr, int64_t t);

  const std::vector<ParamRef>& params() const { return params_; }
  // Parameter i's moments: (numel) f32 tensors.
  const Tensor& m(size_t i) const { return m_[i]; }
  const Tensor& v(size_t i) const { return v_[i]; }

 private:
  OptimizerSpec spec_;
  const kernels::Kernels* k_;
  std::vector<ParamRef> params_;
  std::vector<Tensor> m_, v_;
};

// Sum of squares of every gradient in params (in double, fixed order).
double grad_sum_squares(const std::vector<ParamRef>& params,
                        const kernels::Kernels& k = kernels::cpu_kernels());
// Scales all gradients by max_norm / norm when norm > max_norm (max_norm <= 0: no-op).
// Returns the scale applied (1 when not clipped).
double clip_grads(const std::vector<ParamRef>& params, double norm, double max_norm,
                  const kernels::Kernels& k = kernels::cpu_kernels());

}  // namespace troupe
