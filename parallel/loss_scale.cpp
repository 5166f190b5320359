#include "parallel/loss_scale.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/error.hpp"
#include "model/stage.hpp"

namespace troupe::parallel {

void LossScaler::restore(const LossScaleState& s) {
  require(std::isfinite(s.scale) && s.scale > 0.0 && s.clean_steps >= 0 && s.skipped_steps >= 0,
          "loss scale state: scale ", s.scale, ", clean steps ", s.clean_steps, ", skipped steps ",
          s.skipped_steps, " (the scale must be a positive finite number, the counts >= 0)");
  state_ = s;
}

bool LossScaler::update(bool found_inf) {
  if (!enabled_) return true;
  if (found_inf) {
    state_.scale *= kBackoffFactor;
    state_.clean_steps = 0;
    ++state_.skipped_steps;
    return false;
  }
  if (++state_.clean_steps == kGrowthInterval) {
    state_.scale *= kGrowthFactor;
    state_.clean_steps = 0;
  }
  return true;
}

bool grads_finite(const std::vector<model::Stage*>& stages) {
  for (model::Stage* st : stages) {
    const Tensor& g = st->store().flat_grads();
    // Squares summed in double overflow for no finite float: only an inf or NaN makes it non-finite.
    if (!std::isfinite(st->device_context().kernels->sum_squares(g.f32(), size_t(g.numel())))) return false;
  }
  return true;
}

void scale_grads(const std::vector<model::Stage*>& stages, float s) {
  for (model::Stage* st : stages) {
    const Tensor& g = st->store().flat_grads();
    st->device_context().kernels->scale_inplace(g.f32(), s, size_t(g.numel()));
  }
}

OverflowFault OverflowFault::from_env() {
  OverflowFault f;
  const char* v = std::getenv("TROUPE_INJECT_OVERFLOW");
  if (v == nullptr || *v == '\0') return f;
  long long step = -1;
  int rank = -1;
  char tail = 0;
  TROUPE_CHECK(std::sscanf(v, "%lld:%d%c", &step, &rank, &tail) == 2 && step >= 0 && rank >= 0,
               "TROUPE_INJECT_OVERFLOW=", v, " is not <step>:<rank>");
  f.step = step;
  f.rank = rank;
  return f;
}

void poison_grads(model::Stage& stage, int64_t step, int rank) {
  std::fprintf(stderr,
               "troupe: TROUPE_INJECT_OVERFLOW: rank %d writes an inf into its gradients at step %lld\n",
               rank, static_cast<long long>(step));
  const float inf = std::numeric_limits<float>::infinity();
  stage.device_context().alloc->copy_from_host(stage.store().flat_grads().data(), &inf, sizeof inf);
}

}  // namespace troupe::parallel
