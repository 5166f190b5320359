#include "cli/progress.hpp"

#include <unistd.h>

#include <cmath>

namespace troupe::cli {

std::string format_duration(double seconds) {
  long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

Progress::Progress(int64_t total_steps, int64_t log_every, bool enabled)
    : total_(total_steps),
      every_(log_every > 0 ? log_every : 1),
      enabled_(enabled),
      tty_(isatty(STDOUT_FILENO)) {}

void Progress::step(int64_t step, double loss, double lr, double tokens_per_s, double step_ms,
                    double val_loss) {
  if (!enabled_) return;
  // The ETA follows an exponential average of step times, so a slow first step fades.
  ema_ms_ = ema_ms_ == 0 ? step_ms : 0.9 * ema_ms_ + 0.1 * step_ms;
  const double eta = ema_ms_ * double(total_ - step - 1) / 1000.0;
  char line[256];
  std::snprintf(line, sizeof line,
                "step %5lld/%lld | loss %.4f | lr %.2e | %7.0f tok/s | %6.1f ms/step | ETA %s",
                static_cast<long long>(step + 1), static_cast<long long>(total_), loss, lr, tokens_per_s,
                step_ms, format_duration(eta).c_str());
  const bool last = step + 1 == total_;
  if (val_loss >= 0) {
    if (live_) std::printf("\r\033[K");
    live_ = false;
    std::printf("%s | val_loss %.4f\n", line, val_loss);
  } else if (tty_) {
    std::printf("\r\033[K%s", line);
    live_ = true;
    if (last) {
      std::printf("\n");
      live_ = false;
    }
  } else if ((step + 1) % every_ == 0 || step == 0 || last) {
    std::printf("%s\n", line);
  }
  std::fflush(stdout);
}

void Progress::message(const std::string& text) {
  if (live_) std::printf("\r\033[K");
  live_ = false;
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void Progress::finish() {
  if (live_) std::printf("\n");
  live_ = false;
  std::fflush(stdout);
}

}  // namespace troupe::cli
