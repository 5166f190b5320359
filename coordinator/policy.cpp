#include "coordinator/policy.hpp"

#include <algorithm>
#include <cstdio>

#include "plan/planner.hpp"

namespace troupe::coord {

// ---------------------------------------------------------------- failures and restarts

std::string without_rank(const std::string& m) {
  size_t colon = m.find(": ");
  bool ranked = m.rfind("rank ", 0) == 0 && colon != std::string::npos && colon > 5 &&
                m.find_first_not_of("0123456789", 5) == colon;
  return ranked ? m.substr(colon + 2) : m;
}

bool repeats_setup_failure(const Job& job, FailureCause cause, const std::string& message) {
  if (job.stepped || job.failures.empty()) return false;
  const auto& prev = job.failures.back();
  return prev.value("before_first_step", false) && prev.value("cause", "") == to_string(cause) &&
         without_rank(prev.value("message", "")) == without_rank(message) &&
         prev.value("generation", -1) == job.generation - 1;
}

FailureVerdict judge_failure(const Job& job, FailureCause cause, const std::string& message) {
  if (!retryable(cause)) return {false, message};
  if (repeats_setup_failure(job, cause, message))
    return {false, message + " (the same failure ended generation " + std::to_string(job.generation - 1) +
                       " before its first step: a setup error that a restart repeats, so the job is not "
                       "restarted again)"};
  const int max = job.request.max_restarts;
  if (job.restarts >= max)
    return {false,
            message + (max == 0 ? ""
                                : " (after " + std::to_string(job.restarts) +
                                      " restart(s); fault.max_restarts = " + std::to_string(max) + ")")};
  return {true, message};
}

double restart_backoff_ms(double first_ms, int restart) {
  double backoff = first_ms;
  for (int i = 1; i < restart && backoff < 8000; ++i) backoff *= 2;
  return std::min(backoff, 8000.0);
}

// ---------------------------------------------------------------- the step watchdog

double median_ms(const std::vector<double>& step_ms) {
  if (step_ms.empty()) return 0;
  std::vector<double> v = step_ms;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double step_timeout_ms(const JobRequest& request, const std::vector<double>& step_ms) {
  if (request.step_timeout_ms > 0) return request.step_timeout_ms;
  if (step_ms.empty()) return 120000;
  return std::max(10000.0, 20.0 * median_ms(step_ms));
}

// ---------------------------------------------------------------- elastic sizing

int min_devices(const Job& job) {
  int n = job.request.min_devices > 0 ? job.request.min_devices : job.request.layout.world();
  return std::min(n, job.layout.world());
}

std::string plan_refusal(const Job& job, int d) {
  try {
    plan::check_fits(job.request.plan, {d, job.layout.pp, job.layout.tp});
    return "";
  } catch (const std::exception& e) {
    return "data " + std::to_string(d) + " cannot be planned: " + e.what();
  }
}

int fit_data_size(const Job& job, int want, int free_devices) {
  const int unit = job.layout.pp * job.layout.tp;
  const int least = min_devices(job);
  for (int d = want; d >= 1; --d) {
    if (d * unit < least) return 0;
    if (d * unit > free_devices) continue;
    if (!plan_refusal(job, d).empty()) continue;
    return d;
  }
  return 0;
}

int64_t drain_step(const Job& job) {
  double median = median_ms(job.step_ms);
  int64_t margin = std::max<int64_t>(3, median > 0 ? static_cast<int64_t>(300.0 / median) + 1 : 3);
  return job.last_step + margin;
}

std::string resize_refusal(const Job& job, int devices, int free_devices) {
  const std::string& id = job.id;
  if (job.state != JobState::running)
    return "job " + id + " is " + to_string(job.state) + "; only a running job is resized";
  if (job.drain_step >= 0) return "job " + id + " is already being resized";
  const int unit = job.layout.pp * job.layout.tp;
  if (devices <= 0 || devices % unit != 0)
    return std::to_string(devices) +
           " devices is not a multiple of pipeline x tensor = " + std::to_string(unit) +
           " (the layout keeps them)";
  int d = devices / unit;
  if (std::string why = plan_refusal(job, d); !why.empty()) return why;
  if (d == job.layout.dp) return "job " + id + " already runs on " + std::to_string(devices) + " devices";
  if (devices > job.layout.world() + free_devices)
    return "not enough free devices: " + std::to_string(devices) + " wanted, " +
           std::to_string(job.layout.world()) + " held + " + std::to_string(free_devices) + " free";
  if (drain_step(job) + 1 >= job.request.total_steps)
    return "job " + id + " ends (step " + std::to_string(job.request.total_steps) +
           ") before it could be resized";
  return "";
}

int grow_data_size(const Job& job, int free_devices) {
  if (job.state != JobState::running || job.drain_step >= 0 || job.last_step < 0) return 0;
  int max_devices = job.request.max_devices > 0 ? job.request.max_devices : job.request.layout.world();
  int want = max_devices / (job.layout.pp * job.layout.tp);
  if (want <= job.layout.dp) return 0;
  int d = fit_data_size(job, want, free_devices + job.layout.world());
  return d > job.layout.dp ? d : 0;
}

// ---------------------------------------------------------------- auto jobs

int auto_min_devices(const Job& job) { return std::max(1, job.request.min_devices); }

int auto_max_devices(const Job& job) {
  if (job.request.max_devices > 0) return job.request.max_devices;
  return job.first_devices > 0 ? job.first_devices : plan::kMaxWorld;
}

std::optional<Job::Choice> plan_auto(const Job& job, int devices, std::string* why) {
  try {
    const JobSpec spec = parse_spec(job.request.spec_yaml, job.request.name + " (resolved spec)");
    const plan::HardwareProfile hw =
        plan::parse_hardware(job.request.hardware_yaml, "the job's hardware profile");
    const plan::Choice c = plan::choose(spec, devices, hw);
    const plan::Candidate& k = c.estimate.candidate;
    if (k.layout.world() < auto_min_devices(job)) {
      if (why)
        *why = "the plan for " + std::to_string(devices) + " devices uses " +
               std::to_string(k.layout.world()) +
               ", fewer than elastic.min_devices = " + std::to_string(auto_min_devices(job));
      return std::nullopt;
    }
    Job::Choice out;
    out.spec_yaml = to_yaml(c.spec);
    out.layout = k.layout;
    out.micro_batch = k.micro_batch;
    out.boundaries = c.estimate.boundaries;
    out.event = {{"event", "plan"},
                 {"job", job.id},
                 {"devices", devices},
                 {"layout", k.layout.str()},
                 {"virtual_stages", k.virtual_stages},
                 {"micro_batch", k.micro_batch},
                 {"recompute", to_string(k.recompute)},
                 {"predicted_step_s", c.estimate.time.step},
                 {"predicted_tokens_per_s", c.estimate.tokens_per_s},
                 {"predicted_memory_bytes", c.estimate.memory.total},
                 {"hardware", hw.name},
                 {"candidates", c.candidates},
                 {"why", c.why}};
    return out;
  } catch (const std::exception& e) {
    if (why) *why = "no plan for " + std::to_string(devices) + " device(s): " + e.what();
    return std::nullopt;
  }
}

int auto_devices(const Job& job, int free_devices) {
  if (job.target_devices > 0) return job.target_devices;
  return std::min(free_devices, auto_max_devices(job));
}

std::string auto_resize_refusal(const Job& job, int devices, int free_devices) {
  const std::string& id = job.id;
  if (job.state != JobState::running)
    return "job " + id + " is " + to_string(job.state) + "; only a running job is resized";
  if (job.drain_step >= 0) return "job " + id + " is already being resized";
  if (devices < 1) return std::to_string(devices) + " devices: a job needs at least one";
  if (devices == job.layout.world())
    return "job " + id + " already runs on " + std::to_string(devices) + " devices";
  if (devices > job.layout.world() + free_devices)
    return "not enough free devices: " + std::to_string(devices) + " wanted, " +
           std::to_string(job.layout.world()) + " held + " + std::to_string(free_devices) + " free";
  std::string why;
  const auto c = plan_auto(job, devices, &why);
  if (!c) return why;
  if (c->layout.world() != devices)
    return "no layout of " + std::to_string(devices) + " devices divides the job (the planner would use " +
           std::to_string(c->layout.world()) + ")";
  if (drain_step(job) + 1 >= job.request.total_steps)
    return "job " + id + " ends (step " + std::to_string(job.request.total_steps) +
           ") before it could be resized";
  return "";
}

int auto_grow_devices(const Job& job, int free_devices) {
  if (job.state != JobState::running || job.drain_step >= 0 || job.last_step < 0 || free_devices <= 0)
    return 0;
  const int want = std::min(job.layout.world() + free_devices, auto_max_devices(job));
  if (want <= job.layout.world()) return 0;
  const auto c = plan_auto(job, want, nullptr);
  if (!c || c->layout.world() <= job.layout.world()) return 0;
  // Only for a faster step: more devices can be slower (communication, a worse split).
  const double step = c->event.value("predicted_step_s", 0.0);
  if (job.predicted_step_s > 0 && step >= job.predicted_step_s) return 0;
  if (!auto_resize_refusal(job, c->layout.world(), free_devices).empty()) return 0;
  return c->layout.world();
}

}  // namespace troupe::coord
