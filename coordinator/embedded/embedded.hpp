// `troupe run` on one machine: the coordinator and a local agent in this
// process, the workers as child processes, the job run to completion.
#pragma once

#include <string>

#include "core/spec.hpp"

namespace troupe::embedded {

struct RunOptions {
  std::string runs_dir = "runs";
  std::string devices;  // "" = as many devices of the spec's kind as the layout needs ("cpu:N")
  std::string worker_binary = "/proc/self/exe";
  bool quiet = false;  // no per-step lines on stdout
};

// Exit code: 0 the job succeeded; 1 it failed (the cause is printed); 2 the
// spec or options are invalid; 130 interrupted (SIGINT/SIGTERM: the job is
// cancelled and every worker killed and reaped before returning).
int run_job_embedded(const JobSpec& spec, const RunOptions& options);

}  // namespace troupe::embedded
