// Timing a training step in a benchmark: the process's CPU time (all threads) and the
// median of a run of samples. Shared by train_throughput and snapshot_cost.
#pragma once

#include <time.h>

#include <algorithm>
#include <vector>

namespace troupe::bench {

inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The upper median (v[n/2] once sorted); v must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace troupe::bench
