#include "parallel/loss_scale.hpp"

#include <cmath>

#include "core/error.hpp"

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

}  // namespace troupe::parallel
