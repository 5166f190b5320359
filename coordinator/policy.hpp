// A job's failure, restart and elasticity policy as pure functions of its
// request (fault.*, elastic.*, the batch) and its history (failures, restarts,
// step times). CoordinatorState applies them; tests call them directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/state.hpp"
#include "core/failure.hpp"

namespace troupe::coord {

// ---- failures and restarts

// What follows a failure of the job's current generation: a restart, or the
// job fails with `message` (the failure's own, plus why there is no restart).
struct FailureVerdict {
  bool restart = false;
  std::string message;
};
// Judged before the failure joins job.failures. No restart for a cause that is
// not retryable(), for a repeated setup failure (repeats_setup_failure), or once
// fault.max_restarts restarts are spent:
//   max_restarts 1, restarts 1, "rank 0 (pid 7, ...) exited with code 3"
//   -> {false, "rank 0 (pid 7, ...) exited with code 3 (after 1 restart(s); fault.max_restarts = 1)"}
FailureVerdict judge_failure(const Job& job, FailureCause cause, const std::string& message);
// The same failure, word for word, before the first step of two generations in a
// row is a setup error that a relaunch repeats (a missing file, a bad path).
// Whichever rank reports it, it is the same: messages compare without "rank N: ".
bool repeats_setup_failure(const Job& job, FailureCause cause, const std::string& message);
// "rank 12: no such file" -> "no such file"; any other text is returned as it is.
std::string without_rank(const std::string& message);
// The wait before the `restart`-th restart in a row (1, 2, ...) of generations that failed
// before their first step (Job::crash_streak; a generation that trained starts again at 1):
// fault.restart_backoff (`first_ms`), doubled with each, at most 8 s.
//   first 250 ms: 250, 500, 1000, ..., 8000, 8000
double restart_backoff_ms(double first_ms, int restart);

// ---- the step watchdog

// The median of recent step times (0 when there are none).
double median_ms(const std::vector<double>& step_ms);
// fault.step_timeout when set; else max(10 s, 20 x the median step time), and
// 120 s until a step has been measured (start-up: engine build, rendezvous, loading).
double step_timeout_ms(const JobRequest& request, const std::vector<double>& step_ms);

// ---- elastic sizing (pipeline x tensor stays; the data size changes)

// The fewest devices the job runs on: elastic.min_devices (0 = the planned
// layout's size), and never more than the current generation has.
int min_devices(const Job& job);
// "" when the job can be planned (plan::check_fits) with data size d and its pipeline
// and tensor sizes, else why not: global_batch must split into d replicas of whole
// micro-batches, and the schedule must run with the micro-batches that leaves.
std::string plan_refusal(const Job& job, int d);
// The largest data size <= want whose devices fit `free_devices`, stay at or
// above min_devices and can be planned; 0 if none.
//   pp x tp = 2, global_batch 12, micro_batch 2, want 4, 8 free: data 3 (12 = 3 x 2 x 2)
int fit_data_size(const Job& job, int want, int free_devices);
// "" when a running job may be resized to `devices` devices with `free_devices`
// more free, else why not (the API's cannot_scale message).
std::string resize_refusal(const Job& job, int devices, int free_devices);
// The step after which every rank checkpoints and stops for a resize: ranks run
// in lockstep within a step or so of the last one every rank reported; the
// margin leaves ~300 ms (at least 3 steps) for the drain message to arrive.
int64_t drain_step(const Job& job);
// The data size a running job grows to when `free_devices` more are free and
// elastic.max_devices allows it; 0 = it stays as it is.
int grow_data_size(const Job& job, int free_devices);

// ---- auto jobs: the planner at every launch (plan/planner.hpp)

// The fewest and the most devices an auto job runs on: elastic.min_devices (0: 1) and
// elastic.max_devices (0: what its first plan used; before that, no bound).
int auto_min_devices(const Job& job);
int auto_max_devices(const Job& job);
// The planner's choice for `devices` devices (fewer when no layout of that many divides the
// job), or nullopt with why in *why: nothing fits, or the choice would use fewer devices than
// auto_min_devices.
std::optional<Job::Choice> plan_auto(const Job& job, int devices, std::string* why);
// The devices an auto job is planned for at its next launch when `free_devices` are free
// (its own included): a resize's target, else all of them up to auto_max_devices.
int auto_devices(const Job& job, int free_devices);
// "" when a running auto job may be resized to `devices` devices with `free_devices` more
// free (any layout the planner chooses for that many), else why not.
std::string auto_resize_refusal(const Job& job, int devices, int free_devices);
// The devices a running auto job grows to with `free_devices` more free: more than it holds,
// at most auto_max_devices, and only when the planner predicts a faster step there; 0 = it
// stays as it is.
int auto_grow_devices(const Job& job, int free_devices);

}  // namespace troupe::coord
