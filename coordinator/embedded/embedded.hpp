// `troupe run` on one machine: the coordinator and a local agent in this
// process, the workers as child processes, the job run to completion.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/spec.hpp"

namespace troupe::embedded {

struct RunOptions {
  std::string runs_dir = "runs";
  std::string devices;  // "" = as many devices of the spec's kind as the layout needs ("cpu:N")
  std::string worker_binary = "/proc/self/exe";
  bool quiet = false;       // no per-step lines on stdout
  std::string resume_from;  // checkpoint directory to resume every rank from ("" = fresh)
  std::string http;         // serve the dashboard and /metrics at HOST:PORT ("" = none)
  std::string hardware;     // an auto job's hardware profile (YAML) when its spec names none ("" = default)
  // Called with each "plan" event of the job (an auto job's layout chosen at a launch).
  std::function<void(const nlohmann::json&)> on_plan;
  // Called with each step's metrics line (as in metrics.jsonl) instead of printing it.
  std::function<void(const nlohmann::json&)> on_step;
  // Called once with the job id and run directory after the job is accepted.
  std::function<void(const std::string& job, const std::string& run_dir)> on_submitted;
};

// Exit code: 0 the job succeeded; 1 it failed (the cause is printed); 2 the
// spec or options are invalid; 130 interrupted (SIGINT/SIGTERM: the job is
// cancelled and every worker killed and reaped before returning).
int run_job_embedded(const JobSpec& spec, const RunOptions& options);

}  // namespace troupe::embedded
