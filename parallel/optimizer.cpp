#include "parallel/optimizer.hpp"

#include <cmath>

#include "core/error.hpp"

namespace troupe {

double lr_at(const TrainSpec& train, int64_t step) {
  const double max_lr = train.optimizer.lr;
  if (step < train.warmup_steps) return max_lr * double(step + 1) / double(train.warmup_steps);
  if (train.lr_schedule == LrSchedule::constant) return max_lr;
  const int64_t decay_steps = train.steps - train.warmup_steps;
  if (decay_steps <= 0) return max_lr;
  double progress = double(step - train.warmup_steps) / double(decay_steps);
  progress = std::min(1.0, std::max(0.0, progress));
  const double min_lr = train.min_lr;
  if (train.lr_schedule == LrSchedule::linear) return max_lr + (min_lr - max_lr) * progress;
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const OptimizerSpec& spec, std::vector<ParamRef> params, const kernels::Kernels& k,
             Allocator& alloc)
    : spec_(spec), k_(&k), params_(std::move(params)) {
  TROUPE_CHECK(alloc.device() == k.device, "AdamW with the '", k.name, "' kernels of ", device_name(k.device),
               " keeps its moments on that device, not in the '", alloc.name(), "' allocator's memory");
  m_.reserve(params_.size());
  v_.reserve(params_.size());
  for (const auto& p : params_) {
    TROUPE_CHECK(p.data && (p.grad || p.numel == 0), "parameter ", p.name, " has no buffer");
    m_.push_back(Tensor::zeros({int64_t(p.numel)}, DType::f32, alloc));
    v_.push_back(Tensor::zeros({int64_t(p.numel)}, DType::f32, alloc));
  }
}

void AdamW::step(double lr, int64_t t) {
  TROUPE_CHECK(t >= 1, "AdamW step count is 1-based, got ", t);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& p = params_[i];
    k_->adamw_update(p.data, p.grad, m_[i].f32(), v_[i].f32(), p.numel, float(lr), float(spec_.beta1),
                     float(spec_.beta2), float(spec_.eps), p.decay ? float(spec_.weight_decay) : 0.0f, t);
  }
}

double grad_sum_squares(const std::vector<ParamRef>& params, const kernels::Kernels& k) {
  double s = 0.0;
  for (const auto& p : params) s += k.sum_squares(p.grad, p.numel);
  return s;
}

double clip_grads(const std::vector<ParamRef>& params, double norm, double max_norm,
                  const kernels::Kernels& k) {
  if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0;
  // The same expression as torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6).
  const double scale = max_norm / (norm + 1e-6);
  for (const auto& p : params) k.scale_inplace(p.grad, float(scale), p.numel);
  return scale;
}

}  // namespace troupe
