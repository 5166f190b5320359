#include "worker/train_loop.hpp"

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"

namespace troupe {

LoopEnd train_to_end(Engine& engine, const JobSpec& spec, const std::string& ckpt_dir,
                     LoopReporter& reporter) {
  const int64_t every = spec.checkpoint.every;
  // The state at the first step is on disk when the engine resumed from this job's own
  // checkpoint of that step (a resume from elsewhere still saves into ckpt_dir).
  int64_t on_disk = engine.resumed() && checkpoint::is_checkpoint_dir(
                                            ckpt_dir + "/" + checkpoint::step_dir_name(engine.next_step()))
                        ? engine.next_step()
                        : -1;
  auto save = [&] {
    reporter.checkpoint_started(engine.save_checkpoint(ckpt_dir));
    on_disk = engine.next_step();
  };
  LoopEnd end = LoopEnd::finished;
  while (!engine.done()) {
    const StepReport r = engine.step();
    reporter.step(r);
    if (every > 0 && (r.step + 1) % every == 0) save();
    // A resize: every rank got the same drain step and stops after it.
    const int64_t drain = reporter.drain_after();
    if (drain >= 0 && r.step > drain)
      throw Error("drain after step " + std::to_string(drain) + " arrived after step " +
                  std::to_string(r.step));
    if (drain >= 0 && r.step == drain) {
      end = LoopEnd::drained;
      break;
    }
  }
  // Collective: every rank of the generation reaches this point with the same on_disk.
  if (on_disk != engine.next_step()) save();
  reporter.checkpoint_committed(engine.wait_checkpoint());
  return end;
}

}  // namespace troupe
