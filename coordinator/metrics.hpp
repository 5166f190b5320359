// Aggregates the per-rank step reports of one job generation into one
// metrics.jsonl line per optimizer step.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace troupe::coord {

struct StepSample {
  int rank = 0;
  int64_t step = 0;
  double loss = 0, lr = 0;
  int64_t tokens = 0;
  double step_ms = 0, grad_norm = 0;
  std::optional<double> val_loss;
  double compute_ms = 0, comm_ms = 0, bubble_ms = 0;
  double loss_scale = 0;                            // fp16 loss scaling: the step's scale (0: not scaling)
  bool skipped = false;                             // the rank skipped the optimizer step (inf/NaN gradients)
  int64_t device_bytes = 0, device_peak_bytes = 0;  // a GPU rank's device memory (0 on the CPU)
  // Buddies: the step the rank's newest snapshot its buddy confirmed continues with (-1: none).
  int64_t snapshot_confirmed = -1;
};

class MetricsAggregator {
 public:
  MetricsAggregator(int world, int generation, std::string layout);

  // Adds one rank's report. When every rank has reported step s, returns its
  // line: step, loss, lr, tokens, grad_norm and val_loss from the last rank
  // (it holds the last pipeline stage, where the loss is computed; every rank
  // reports the global-batch mean), step_ms = the slowest rank's,
  // tokens_per_s = tokens / step_ms, generation and layout. With fp16 loss scaling
  // also loss_scale, skipped (the last rank's) and skipped_ranks (how many ranks
  // skipped: all or none, since one all-reduced flag decides). With buddies also
  // snapshot_confirmed: the lowest over the ranks (every step before it is completed: each
  // rank's state after it is held by the rank and its buddy).
  // A duplicate or out-of-world report is ignored (returns nullopt).
  std::optional<nlohmann::json> add(const StepSample& s);

  int64_t steps_completed() const { return completed_; }
  int pending_steps() const { return static_cast<int>(pending_.size()); }

 private:
  int world_, generation_;
  std::string layout_;
  std::map<int64_t, std::map<int, StepSample>> pending_;  // step -> rank -> sample
  int64_t completed_ = 0;
  int64_t last_emitted_ = -1;
};

}  // namespace troupe::coord
