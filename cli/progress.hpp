// Progress output of a training run: a live line on a terminal, plain log lines otherwise.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace troupe::cli {

class Progress {
 public:
  Progress(int64_t total_steps, int64_t log_every, bool enabled);
  // One step finished: step is 0-based; val_loss < 0 when there was no eval.
  void step(int64_t step, double loss, double lr, double tokens_per_s, double step_ms, double val_loss);
  void message(const std::string& line);  // a line of its own, above the live line
  void finish();

 private:
  int64_t total_, every_;
  bool enabled_, tty_;
  bool live_ = false;
  double ema_ms_ = 0;
};

std::string format_duration(double seconds);  // "1:05", "1:02:03"

}  // namespace troupe::cli
