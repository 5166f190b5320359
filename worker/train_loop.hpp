// The one training loop of a rank: steps the engine to the end of the job, saving
// checkpoints as the spec says, and tells a reporter what happened. The worker
// process (reports to the coordinator) and `troupe run --in-process` (writes the
// run directory itself) both run it, so both save under the same rules:
//   * after every step s with (s + 1) % checkpoint.every == 0;
//   * on a drain (a resize) after the drain step, then stop;
//   * the final state at the end, unless it is already on disk (saved by the loop,
//     or the checkpoint of that step in ckpt_dir the engine resumed from);
//   * the loop returns only after the last checkpoint is committed.
#pragma once

#include <cstdint>
#include <string>

#include "worker/engine.hpp"

namespace troupe {

class LoopReporter {
 public:
  virtual ~LoopReporter() = default;
  virtual void step(const StepReport& r) = 0;
  virtual void checkpoint_started(const std::string& /*dir*/) {}
  virtual void checkpoint_committed(const std::string& /*dir*/) {}
  // A resize: checkpoint after this step and stop (-1 = none). Polled after each step.
  virtual int64_t drain_after() { return -1; }
};

enum class LoopEnd { finished, drained };

// Throws what the engine throws (EngineAborted after request_abort()), and Error when
// a drain arrives after its step has passed (the rank cannot join the others' checkpoint).
LoopEnd train_to_end(Engine& engine, const JobSpec& spec, const std::string& ckpt_dir,
                     LoopReporter& reporter);

}  // namespace troupe
