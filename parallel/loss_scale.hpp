// Dynamic loss scaling for fp16 training, with the semantics and defaults of
// torch.cuda.amp.GradScaler: the loss gradient is multiplied by `scale` so that
// small fp16 gradients do not flush to zero; when any rank finds an inf or NaN in
// its gradients, every rank skips the optimizer step and the scale halves; after
// `growth_interval` clean steps in a row it doubles.
//
//   step  scale   found_inf  ->  stepped  scale after
//   0     65536   no             yes      65536  (clean 1)
//   1     65536   yes            no       32768  (clean 0)
//   ...   after 2000 clean steps in a row          65536
//
// bf16 and fp32 do not scale: a disabled scaler has scale 1 and never skips.
// The state (scale, the clean-step run, the steps skipped so far) is part of a
// checkpoint, so that a resumed fp16 run continues bit for bit.
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::model {
class Stage;
}

namespace troupe::parallel {

struct LossScaleState {
  double scale = 65536.0;     // 2^16, GradScaler's init_scale
  int64_t clean_steps = 0;    // steps in a row without inf/NaN since the last change
  int64_t skipped_steps = 0;  // optimizer steps skipped so far (AdamW counts only the others)
};

class LossScaler {
 public:
  static constexpr double kInitScale = 65536.0;
  static constexpr double kGrowthFactor = 2.0;
  static constexpr double kBackoffFactor = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;

  explicit LossScaler(bool enabled) : enabled_(enabled) {}

  bool enabled() const { return enabled_; }
  // What the loss gradient is multiplied by this step: the scale, or 1 when disabled.
  double scale() const { return enabled_ ? state_.scale : 1.0; }
  const LossScaleState& state() const { return state_; }
  // Restores a checkpoint's state (throws troupe::Error for a scale that is not a
  // positive finite number or negative counts).
  void restore(const LossScaleState& s);

  // After a step's gradients are complete on every rank: found_inf is whether any
  // rank saw an inf or NaN (the same on every rank). Returns true when the optimizer
  // steps, false when this step is skipped; updates the scale.
  bool update(bool found_inf);

 private:
  bool enabled_;
  LossScaleState state_;
};

// Whether every gradient of these stages is finite (one pass over the flat buffers).
bool grads_finite(const std::vector<model::Stage*>& stages);
// Multiplies every gradient of these stages by s (unscaling before clipping and AdamW).
void scale_grads(const std::vector<model::Stage*>& stages, float s);

// Test hook, off unless TROUPE_INJECT_OVERFLOW=<step>:<rank> is set: that rank writes an
// inf into its gradients at that step (generation 0 only), as an fp16 overflow would;
// tests show with it that every rank then skips the step together.
struct OverflowFault {
  int64_t step = -1;
  int rank = -1;
  // Throws troupe::Error when the variable is set but not <step>:<rank>.
  static OverflowFault from_env();
  bool fires(int64_t at_step, int at_rank, int generation) const {
    return at_step == step && at_rank == rank && generation == 0;
  }
};
// Writes +inf into the first gradient of the stage (and says so on stderr).
void poison_grads(model::Stage& stage, int64_t step, int rank);

}  // namespace troupe::parallel
