#include "coordinator/metrics.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::coord {

MetricsAggregator::MetricsAggregator(int world, int generation, std::string layout)
    : world_(world), generation_(generation), layout_(std::move(layout)) {}

std::optional<nlohmann::json> MetricsAggregator::add(const StepSample& s) {
  if (s.rank < 0 || s.rank >= world_ || s.step <= last_emitted_) return std::nullopt;
  auto& ranks = pending_[s.step];
  if (!ranks.emplace(s.rank, s).second) return std::nullopt;
  if (static_cast<int>(ranks.size()) < world_) return std::nullopt;

  const StepSample& last = ranks.at(world_ - 1);
  // The step takes as long as its slowest rank; the split into compute, communication
  // and pipeline bubble is the mean over ranks.
  double step_ms = 0, compute_ms = 0, comm_ms = 0, bubble_ms = 0;
  for (const auto& [r, x] : ranks) {
    step_ms = std::max(step_ms, x.step_ms);
    compute_ms += x.compute_ms / world_;
    comm_ms += x.comm_ms / world_;
    bubble_ms += x.bubble_ms / world_;
  }
  nlohmann::json line = {
      {"step", s.step},
      {"loss", last.loss},
      {"lr", last.lr},
      {"tokens", last.tokens},
      {"tokens_per_s", step_ms > 0 ? last.tokens / (step_ms / 1000.0) : 0.0},
      {"step_ms", step_ms},
      // A skipped fp16 step has no norm (NaN): null in the JSON.
      {"grad_norm", std::isfinite(last.grad_norm) ? nlohmann::json(last.grad_norm) : nlohmann::json()},
      {"compute_ms", compute_ms},
      {"comm_ms", comm_ms},
      {"bubble_ms", bubble_ms},
      {"bubble_fraction", step_ms > 0 ? bubble_ms / step_ms : 0.0},
      {"generation", generation_},
      {"layout", layout_}};
  if (last.val_loss) line["val_loss"] = *last.val_loss;
  // GPU ranks: the largest device memory in use after the step, and the largest peak.
  int64_t device = 0, device_peak = 0;
  for (const auto& [r, x] : ranks) {
    device = std::max(device, x.device_bytes);
    device_peak = std::max(device_peak, x.device_peak_bytes);
  }
  if (device_peak > 0) {
    line["device_bytes"] = device;
    line["device_peak_bytes"] = device_peak;
  }
  int64_t confirmed = ranks.empty() ? -1 : ranks.begin()->second.snapshot_confirmed;
  for (const auto& [r, x] : ranks) confirmed = std::min(confirmed, x.snapshot_confirmed);
  if (confirmed >= 0) line["snapshot_confirmed"] = confirmed;
  if (last.loss_scale > 0) {
    int skipped = 0;
    for (const auto& [r, x] : ranks) skipped += x.skipped ? 1 : 0;
    line["loss_scale"] = last.loss_scale;
    line["skipped"] = last.skipped;
    line["skipped_ranks"] = skipped;
  }
  pending_.erase(s.step);
  last_emitted_ = std::max(last_emitted_, s.step);
  ++completed_;
  return line;
}

}  // namespace troupe::coord
