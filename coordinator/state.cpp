#include "coordinator/state.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "core/run_dir.hpp"

namespace troupe::coord {

double now_ms() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count() / 1000.0;
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE";
    default:
      return "signal " + std::to_string(sig);
  }
}

void Actions::append(Actions&& o) {
  for (auto& x : o.launches) launches.push_back(std::move(x));
  for (auto& x : o.aborts) aborts.push_back(std::move(x));
  for (auto& x : o.kills) kills.push_back(std::move(x));
  for (auto& x : o.drains) drains.push_back(std::move(x));
  for (auto& x : o.events) events.push_back(std::move(x));
}

CoordinatorState::CoordinatorState(std::string runs_root, int protocol_version)
    : runs_root_(std::move(runs_root)),
      protocol_(protocol_version),
      make_id_(make_job_id),
      find_checkpoint_([](const std::string& root, std::vector<std::string>* skipped) {
        return checkpoint::latest_valid(root, skipped).value_or("");
      }) {
  std::error_code ec;
  auto abs = std::filesystem::absolute(runs_root_, ec);
  if (!ec) runs_root_ = abs.lexically_normal().string();
}

// ---------------------------------------------------------------- agents

RegisterResult CoordinatorState::register_agent(int protocol, const std::string& host, int pid,
                                                const std::vector<std::string>& devices, Actions* out) {
  if (protocol != protocol_)
    return {false, "protocol version mismatch: the agent speaks protocol " + std::to_string(protocol) +
                       ", the coordinator speaks protocol " + std::to_string(protocol_) +
                       "; run the same troupe version on every node"};
  std::string id;
  try {
    id = registry_.add_agent(host, pid, devices);
  } catch (const Error& e) {
    return {false, std::string("agent refused: ") + e.what()};
  }
  out->events.push_back({{"event", "agent"},
                         {"agent", id},
                         {"host", host},
                         {"pid", pid},
                         {"devices", devices},
                         {"state", "registered"}});
  schedule(out);
  return {true, id};
}

void CoordinatorState::remove_agent(const std::string& agent_id, Actions* out) {
  const Agent* a = registry_.agent(agent_id);
  if (!a) return;
  std::string who = agent_id + " on " + a->host + " (pid " + std::to_string(a->pid) + ")";
  auto affected = registry_.remove_agent(agent_id);
  out->events.push_back({{"event", "agent"}, {"agent", agent_id}, {"state", "lost"}});
  for (const auto& job_id : affected) {
    Job* j = find(job_id);
    if (!j || is_terminal(j->state)) continue;
    // Its workers died with it (PDEATHSIG); nobody will report their exit.
    int first = -1;
    for (size_t r = 0; r < j->ranks.size(); ++r)
      if (j->ranks[r].device.agent_id == agent_id) {
        j->ranks[r].exited = true;
        if (first < 0) first = static_cast<int>(r);
      }
    if (j->state == JobState::recovering) continue;
    on_failure(*j, "agent_lost", "agent " + who + " disconnected", first, out);
  }
  schedule(out);
}

// ---------------------------------------------------------------- jobs

Job* CoordinatorState::find(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const Job* CoordinatorState::job(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

bool CoordinatorState::current(const std::string& job_id, int generation) const {
  const Job* j = job(job_id);
  return j && j->generation == generation && !is_terminal(j->state);
}

std::string CoordinatorState::submit(JobRequest request, Actions* out) {
  TROUPE_CHECK(request.layout.world() > 0, "bad layout ", request.layout.str());
  std::string id = make_id_();
  while (jobs_.count(id)) id = make_id_();
  Job& j = jobs_[id];
  j.id = id;
  j.request = std::move(request);
  j.layout = j.request.layout;
  j.resume_from = j.request.resume_from;
  j.run_dir = runs_root_ + "/" + j.request.name + "-" + id;
  j.submitted_ms = now_ms();
  order_.push_back(id);
  out->events.push_back({{"event", "submitted"},
                         {"job", id},
                         {"name", j.request.name},
                         {"run_dir", j.run_dir},
                         {"layout", j.request.layout.str()},
                         {"spec", j.request.spec_yaml}});
  out->events.push_back({{"event", "state"}, {"job", id}, {"state", "queued"}, {"reason", ""}});
  schedule(out);
  return id;
}

void CoordinatorState::transition(Job& job, JobState to, const std::string& reason, Actions* out) {
  if (!transition_allowed(job.state, to)) throw IllegalTransition(job.state, to);
  job.state = to;
  job.reason = reason;
  if (is_terminal(to)) job.finished_ms = now_ms();
  out->events.push_back({{"event", "state"}, {"job", job.id}, {"state", to_string(to)}, {"reason", reason}});
}

void CoordinatorState::schedule(Actions* out) {
  double now = now_ms();
  // A recovering job had its devices first: it chooses before queued jobs.
  for (const auto& id : order_) {
    Job& j = jobs_.at(id);
    if (j.state == JobState::recovering) try_relaunch(j, now, out);
  }
  for (const auto& id : order_) {
    Job& j = jobs_.at(id);
    if (j.state == JobState::queued) try_place(j, out);
  }
  grow(out);
}

bool CoordinatorState::try_place(Job& job, Actions* out) {
  std::string why;
  const auto& req = job.request;
  auto devices = registry_.allocate(job.id, req.device_kind, job.layout.world(), &why);
  if (!devices) {
    if (why != job.reason) {
      job.reason = why;
      out->events.push_back({{"event", "waiting"}, {"job", job.id}, {"state", "queued"}, {"reason", why}});
    }
    return false;
  }
  transition(job, JobState::planning, "", out);
  launch(job, *devices, out);
  return true;
}

void CoordinatorState::launch(Job& job, const std::vector<DeviceRef>& devices, Actions* out) {
  job.ranks.assign(devices.size(), RankSlot{});
  for (size_t r = 0; r < devices.size(); ++r) {
    job.ranks[r].device = devices[r];
    if (const Agent* a = registry_.agent(devices[r].agent_id)) job.ranks[r].host = a->host;
  }
  job.metrics = std::make_unique<MetricsAggregator>(job.layout.world(), job.generation, job.layout.str());
  job.stepped = false;
  std::string placed;
  for (size_t r = 0; r < devices.size(); ++r)
    placed += (r ? ", " : "") + std::to_string(r) + "=" + job.ranks[r].host + "/" + devices[r].device;
  std::string from = job.resume_from.empty() ? "" : ", resuming from " + job.resume_from;
  transition(job, JobState::launching,
             "generation " + std::to_string(job.generation) + ": placed " + job.layout.str() + " on " +
                 placed + from,
             out);
  job.last_progress_ms = 0;
  // Logs of later generations go beside the first one's: workers/<rank>.g<generation>.log.
  std::string suffix = job.generation == 0 ? "" : ".g" + std::to_string(job.generation);
  for (size_t r = 0; r < devices.size(); ++r)
    out->launches.push_back({devices[r].agent_id, job.id, job.generation, static_cast<int>(r),
                             devices[r].device,
                             job.run_dir + "/workers/" + std::to_string(r) + suffix + ".log"});
}

void CoordinatorState::stop_workers(Job& job, const std::string& reason, Actions* out) {
  std::vector<std::string> agents;
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    const RankSlot& s = job.ranks[r];
    if (s.exited) continue;
    if (s.registered && !s.done) out->aborts.push_back({job.id, job.generation, static_cast<int>(r), reason});
    if (registry_.agent(s.device.agent_id) &&
        std::find(agents.begin(), agents.end(), s.device.agent_id) == agents.end())
      agents.push_back(s.device.agent_id);
  }
  for (const auto& a : agents) out->kills.push_back({a, job.id, job.generation});
}

void CoordinatorState::fail(Job& job, const std::string& name, const std::string& message, Actions* out) {
  if (is_terminal(job.state)) return;
  job.failure_name = name;
  transition(job, JobState::failed, name + ": " + message, out);
  stop_workers(job, "job failed: " + name, out);
  registry_.release(job.id);
  store_.drop_job(job.id);
  schedule(out);
}

bool CoordinatorState::cancel(const std::string& job_id, const std::string& reason, Actions* out,
                              std::string* why) {
  Job* j = find(job_id);
  if (!j) {
    if (why) *why = "unknown job '" + job_id + "'";
    return false;
  }
  if (is_terminal(j->state)) {
    if (why) *why = "job " + job_id + " already " + to_string(j->state);
    return false;
  }
  transition(*j, JobState::cancelled, reason, out);
  stop_workers(*j, "job cancelled", out);
  registry_.release(j->id);
  store_.drop_job(j->id);
  schedule(out);
  return true;
}

// ---------------------------------------------------------------- workers

void CoordinatorState::worker_launched(const std::string& job_id, int generation, int rank, int pid) {
  Job* j = find(job_id);
  if (!j || j->generation != generation || rank < 0 || rank >= static_cast<int>(j->ranks.size())) return;
  j->ranks[rank].pid = pid;
}

void CoordinatorState::launch_failed(const std::string& job_id, int generation, int rank,
                                     const std::string& message, Actions* out) {
  Job* j = find(job_id);
  if (!j || j->generation != generation) return;
  if (rank >= 0 && rank < static_cast<int>(j->ranks.size())) j->ranks[rank].exited = true;
  on_failure(*j, "launch_failed", "rank " + std::to_string(rank) + ": " + message, rank, out);
}

WorkerAssignment CoordinatorState::register_worker(int protocol, const std::string& job_id, int generation,
                                                   int rank, const std::string& host, int pid, Actions* out) {
  WorkerAssignment a;
  if (protocol != protocol_) {
    a.refused = "protocol version mismatch: the worker speaks protocol " + std::to_string(protocol) +
                ", the coordinator speaks protocol " + std::to_string(protocol_) +
                "; run the same troupe version on every node";
    if (Job* j = find(job_id); j && j->generation == generation)
      fail(*j, "protocol_mismatch", "rank " + std::to_string(rank) + ": " + a.refused, out);
    return a;
  }
  Job* j = find(job_id);
  if (!j) {
    a.refused = "unknown job '" + job_id + "'";
    return a;
  }
  if (j->generation != generation) {
    a.refused = "stale generation " + std::to_string(generation) + " (job " + job_id + " is at generation " +
                std::to_string(j->generation) + ")";
    return a;
  }
  if (is_terminal(j->state)) {
    a.refused = "job " + job_id + " already " + to_string(j->state);
    return a;
  }
  if (rank < 0 || rank >= static_cast<int>(j->ranks.size())) {
    a.refused =
        "rank " + std::to_string(rank) + " outside the job's world of " + std::to_string(j->ranks.size());
    return a;
  }
  RankSlot& s = j->ranks[rank];
  if (s.registered) {
    a.refused = "rank " + std::to_string(rank) + " of job " + job_id + " is already registered";
    return a;
  }
  s.registered = true;
  s.pid = pid;
  if (!host.empty()) s.host = host;
  ++j->control_messages;
  a.job = j;
  a.rank = rank;
  bool all = true;
  for (const auto& r : j->ranks) all = all && r.registered;
  if (all && j->state == JobState::launching) {
    transition(
        *j, JobState::running,
        std::to_string(j->ranks.size()) + " worker(s) running, generation " + std::to_string(j->generation),
        out);
    j->last_progress_ms = now_ms();
  }
  return a;
}

void CoordinatorState::step(const std::string& job_id, int generation, const StepSample& sample,
                            Actions* out) {
  Job* j = find(job_id);
  if (!j || j->generation != generation || is_terminal(j->state) || !j->metrics) return;
  ++j->control_messages;
  auto line = j->metrics->add(sample);
  if (!line) return;
  j->last_step = sample.step;
  j->stepped = true;
  j->last_loss = (*line)["loss"].get<double>();
  double now = now_ms();
  if (j->first_step_ms == 0) j->first_step_ms = now;
  // The first step of a generation carries its start-up (rendezvous, loading): not a step time.
  if (j->last_progress_ms > 0 && j->metrics->steps_completed() > 1) {
    j->step_ms.push_back((*line)["step_ms"].get<double>());
    if (j->step_ms.size() > 64) j->step_ms.erase(j->step_ms.begin());
  }
  j->last_progress_ms = now;
  out->events.push_back({{"event", "step"}, {"job", job_id}, {"metrics", *line}});
}

void CoordinatorState::worker_done(const std::string& job_id, int generation, int rank, bool ok,
                                   const std::string& error_name, const std::string& message, Actions* out) {
  Job* j = find(job_id);
  if (!j || j->generation != generation || is_terminal(j->state)) return;
  if (rank < 0 || rank >= static_cast<int>(j->ranks.size())) return;
  ++j->control_messages;
  if (!ok) {
    std::string name = error_name.empty() ? "worker_failed" : error_name;
    std::string what = "rank " + std::to_string(rank) + ": " + message;
    // A spec the engine refuses, or a full checkpoint disk, fails the same way on every relaunch.
    if (name == "invalid_spec" || name == "disk_full")
      fail(*j, name, what, out);
    else
      on_failure(*j, name, what, rank, out);
    return;
  }
  j->ranks[rank].done = true;
  j->ranks[rank].where = error_name == "drained" ? "drained" : "finished";
  for (const auto& r : j->ranks)
    if (!r.done) return;
  bool drained = false;
  for (const auto& r : j->ranks) drained = drained || r.where == "drained";
  if (drained) {
    // Every rank checkpointed after the drain step: relaunch at the new size at once.
    int to = j->target_dp;
    transition(*j, JobState::recovering,
               "resize: data " + std::to_string(j->layout.dp) + " -> " + std::to_string(to) +
                   " after the checkpoint of step " + std::to_string(j->drain_step),
               out);
    registry_.release(j->id);
    store_.drop_job(j->id);
    ++j->generation;
    j->drain_step = -1;
    j->relaunch_at_ms = 0;
    j->recovery_deadline_ms = now_ms() + j->request.replacement_wait_ms;
    schedule(out);
    return;
  }
  transition(*j, JobState::succeeded, std::to_string(j->last_step + 1) + " step(s)", out);
  registry_.release(j->id);
  store_.drop_job(j->id);
  schedule(out);
}

void CoordinatorState::worker_exited(const std::string& job_id, int generation, int rank, int pid,
                                     int exit_code, int signal, Actions* out) {
  Job* j = find(job_id);
  if (!j || j->generation != generation || rank < 0 || rank >= static_cast<int>(j->ranks.size())) return;
  RankSlot& s = j->ranks[rank];
  s.exited = true;
  std::string how =
      signal > 0 ? "was killed by " + signal_name(signal) : "exited with code " + std::to_string(exit_code);
  out->events.push_back(
      {{"event", "worker_exit"},
       {"job", job_id},
       {"rank", rank},
       {"pid", pid},
       {"exit_code", exit_code},
       {"signal", signal},
       {"message", "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") " + how}});
  if (is_terminal(j->state) || s.done) return;
  std::string where = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ", " +
                      s.device.device + " on " + s.host + ") ";
  on_failure(*j, signal > 0 ? "worker_killed" : "worker_exited", where + how + " before finishing", rank,
             out);
}

void CoordinatorState::worker_lost(const std::string& job_id, int generation, int rank,
                                   const std::string& why, Actions* out) {
  Job* j = find(job_id);
  if (!j || j->generation != generation || is_terminal(j->state)) return;
  if (rank < 0 || rank >= static_cast<int>(j->ranks.size())) return;
  const RankSlot& s = j->ranks[rank];
  if (s.done || s.exited) return;
  on_failure(*j, "worker_lost",
             "rank " + std::to_string(rank) + " (pid " + std::to_string(s.pid) + ", " + s.device.device +
                 " on " + s.host + ") lost its connection: " + why,
             rank, out);
}

void CoordinatorState::worker_where(const std::string& job_id, int generation, int rank,
                                    const std::string& where) {
  Job* j = find(job_id);
  if (!j || j->generation != generation || rank < 0 || rank >= static_cast<int>(j->ranks.size())) return;
  j->ranks[rank].where = where;
  j->ranks[rank].where_ms = now_ms();
}

// ---------------------------------------------------------------- recovery

std::string CoordinatorState::checkpoint_root(const Job& job) const {
  return job.request.checkpoint_dir.empty() ? job.run_dir + "/ckpt" : job.request.checkpoint_dir;
}

void CoordinatorState::on_failure(Job& job, const std::string& name, const std::string& message, int rank,
                                  Actions* out) {
  if (is_terminal(job.state) || job.state == JobState::recovering) return;
  nlohmann::json f = {{"event", "failure"},
                      {"job", job.id},
                      {"generation", job.generation},
                      {"cause", name},
                      {"rank", rank},
                      {"message", message},
                      {"layout", job.layout.str()},
                      {"step", job.last_step + 1}};
  if (rank >= 0 && rank < static_cast<int>(job.ranks.size())) {
    const RankSlot& s = job.ranks[rank];
    f["host"] = s.host;
    f["pid"] = s.pid;
    f["device"] = s.device.device;
    f["where"] = s.where;
  }
  nlohmann::json where = nlohmann::json::object();
  for (size_t r = 0; r < job.ranks.size(); ++r)
    if (!job.ranks[r].where.empty()) where[std::to_string(r)] = job.ranks[r].where;
  f["ranks_where"] = where;
  f["time_ms"] = now_ms();
  f["before_first_step"] = !job.stepped;
  // The same failure, word for word, before the first step of two generations in a row
  // is a setup error that a relaunch repeats (a missing file, a bad path): no more restarts.
  bool repeated = false;
  if (!job.stepped && !job.failures.empty()) {
    const auto& prev = job.failures.back();
    // Whichever rank reports first, the failure is the same: compare without "rank N: ".
    auto text = [](const std::string& m) {
      size_t colon = m.find(": ");
      bool ranked = m.rfind("rank ", 0) == 0 && colon != std::string::npos && colon > 5 &&
                    m.find_first_not_of("0123456789", 5) == colon;
      return ranked ? m.substr(colon + 2) : m;
    };
    repeated = prev.value("before_first_step", false) && prev.value("cause", "") == name &&
               text(prev.value("message", "")) == text(message) &&
               prev.value("generation", -1) == job.generation - 1;
  }
  job.failures.push_back(f);
  if (job.failures.size() > 32) job.failures.erase(job.failures.begin());
  out->events.push_back(f);

  if (repeated) {
    fail(job, name,
         message + " (the same failure ended generation " + std::to_string(job.generation - 1) +
             " before its first step: a setup error that a restart repeats, so the job is not restarted "
             "again)",
         out);
    return;
  }
  if (job.restarts >= job.request.max_restarts) {
    std::string limit =
        job.request.max_restarts == 0
            ? ""
            : " (after " + std::to_string(job.restarts) +
                  " restart(s); fault.max_restarts = " + std::to_string(job.request.max_restarts) + ")";
    fail(job, name, message + limit, out);
    return;
  }
  ++job.restarts;
  transition(job, JobState::recovering,
             name + ": " + message + "; restart " + std::to_string(job.restarts) + " of " +
                 std::to_string(job.request.max_restarts),
             out);
  // Every survivor aborts its communicators now, so none waits for a timeout.
  stop_workers(job, "generation " + std::to_string(job.generation) + " aborted: " + name, out);
  registry_.release(job.id);
  store_.drop_job(job.id);
  ++job.generation;
  job.drain_step = -1;
  double backoff = job.request.restart_backoff_ms;
  for (int i = 1; i < job.restarts && backoff < 8000; ++i) backoff *= 2;
  double now = now_ms();
  job.relaunch_at_ms = now + std::min(backoff, 8000.0);
  job.recovery_deadline_ms = job.relaunch_at_ms + job.request.replacement_wait_ms;
}

int CoordinatorState::fit_dp(const Job& job, int want, int free_devices) const {
  const int unit = job.layout.pp * job.layout.tp;
  int min_devices = job.request.min_devices > 0 ? job.request.min_devices : job.request.layout.world();
  min_devices = std::min(min_devices, job.layout.world());
  for (int d = want; d >= 1; --d) {
    if (d * unit < min_devices) return 0;
    if (d * unit > free_devices) continue;
    int rows = d * std::max(job.request.micro_batch, 1);
    if (job.request.global_batch > 0 && job.request.global_batch % rows != 0) continue;
    return d;
  }
  return 0;
}

void CoordinatorState::try_relaunch(Job& job, double now, Actions* out) {
  if (job.state != JobState::recovering || now < job.relaunch_at_ms) return;
  const int unit = job.layout.pp * job.layout.tp;
  int want = job.target_dp > 0 ? job.target_dp : job.layout.dp;
  int free_devices = registry_.free(job.request.device_kind);
  int d = fit_dp(job, want, free_devices);
  if (d == 0) {
    int min_devices = job.request.min_devices > 0 ? job.request.min_devices : job.request.layout.world();
    std::string why = "waiting for devices: " + std::to_string(free_devices) + " " + job.request.device_kind +
                      " free, the job needs " + std::to_string(std::min(min_devices, job.layout.world())) +
                      " (a multiple of pipeline x tensor = " + std::to_string(unit) + ")";
    if (now >= job.recovery_deadline_ms) {
      fail(job, "no_devices", why, out);
      return;
    }
    if (why != job.reason) {
      job.reason = why;
      out->events.push_back(
          {{"event", "waiting"}, {"job", job.id}, {"state", "recovering"}, {"reason", why}});
    }
    return;
  }
  std::string why;
  auto devices = registry_.allocate(job.id, job.request.device_kind, d * unit, &why);
  if (!devices) return;
  Layout from = job.layout;
  job.layout.dp = d;
  job.target_dp = 0;
  std::vector<std::string> skipped;
  std::string ckpt = find_checkpoint_(checkpoint_root(job), &skipped);
  for (const auto& s : skipped)
    out->events.push_back({{"event", "log"}, {"job", job.id}, {"message", "checkpoint skipped: " + s}});
  job.resume_from = ckpt.empty() ? job.request.resume_from : ckpt;
  out->events.push_back({{"event", "relaunch"},
                         {"job", job.id},
                         {"generation", job.generation},
                         {"from_layout", from.str()},
                         {"layout", job.layout.str()},
                         {"resume_from", job.resume_from}});
  launch(job, *devices, out);
}

void CoordinatorState::tick(double now, Actions* out) {
  for (const auto& id : order_) {
    Job& j = jobs_.at(id);
    if (j.state == JobState::recovering) {
      try_relaunch(j, now, out);
      continue;
    }
    if (j.state != JobState::running || j.last_progress_ms <= 0) continue;
    double limit = step_timeout_ms(j);
    if (now - j.last_progress_ms <= limit) continue;
    // Blame the rank furthest behind: a rank inside a collective that never
    // returns names the op; the others wait for it.
    std::string detail;
    int rank = -1;
    for (size_t r = 0; r < j.ranks.size(); ++r) {
      const RankSlot& s = j.ranks[r];
      if (s.done) continue;
      if (rank < 0) rank = static_cast<int>(r);
      detail += (detail.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " (pid " +
                std::to_string(s.pid) + " on " + s.host + "): " + (s.where.empty() ? "?" : s.where);
    }
    char buf[96];
    std::snprintf(buf, sizeof buf, "no step completed for %.1f s (limit %.1f s); ",
                  (now - j.last_progress_ms) / 1000.0, limit / 1000.0);
    on_failure(j, "step_timeout", buf + detail, rank, out);
  }
}

double CoordinatorState::step_timeout_ms(const Job& job) const {
  if (job.request.step_timeout_ms > 0) return job.request.step_timeout_ms;
  // Until a step has been measured, start-up (engine build, rendezvous, loading) is bounded generously.
  if (job.step_ms.empty()) return 120000;
  std::vector<double> v = job.step_ms;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return std::max(10000.0, 20.0 * v[v.size() / 2]);
}

bool CoordinatorState::scale(const std::string& job_id, int devices, Actions* out, std::string* why) {
  Job* j = find(job_id);
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (!j) return no("unknown job '" + job_id + "'");
  if (j->state != JobState::running)
    return no("job " + job_id + " is " + to_string(j->state) + "; only a running job is resized");
  if (j->drain_step >= 0) return no("job " + job_id + " is already being resized");
  const int unit = j->layout.pp * j->layout.tp;
  if (devices <= 0 || devices % unit != 0)
    return no(std::to_string(devices) + " devices is not a multiple of pipeline x tensor = " +
              std::to_string(unit) + " (the layout keeps them)");
  int d = devices / unit;
  int rows = d * std::max(j->request.micro_batch, 1);
  if (j->request.global_batch > 0 && j->request.global_batch % rows != 0)
    return no("global_batch " + std::to_string(j->request.global_batch) + " is not divisible by data " +
              std::to_string(d) + " x micro_batch " + std::to_string(std::max(j->request.micro_batch, 1)));
  if (d == j->layout.dp)
    return no("job " + job_id + " already runs on " + std::to_string(devices) + " devices");
  int spare = registry_.free(j->request.device_kind);
  if (devices > j->layout.world() + spare)
    return no("not enough free devices: " + std::to_string(devices) + " wanted, " +
              std::to_string(j->layout.world()) + " held + " + std::to_string(spare) + " free");
  // Ranks run in lockstep within a step or so of the last one every rank
  // reported; the drain step leaves ~300 ms (at least 3 steps) for the message.
  double median = 0;
  if (!j->step_ms.empty()) {
    std::vector<double> v = j->step_ms;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    median = v[v.size() / 2];
  }
  int64_t margin = std::max<int64_t>(3, median > 0 ? static_cast<int64_t>(300.0 / median) + 1 : 3);
  int64_t at = j->last_step + margin;
  if (at + 1 >= j->request.total_steps)
    return no("job " + job_id + " ends (step " + std::to_string(j->request.total_steps) +
              ") before it could be resized");
  j->drain_step = at;
  j->target_dp = d;
  out->events.push_back({{"event", "resize"},
                         {"job", job_id},
                         {"generation", j->generation},
                         {"from_layout", j->layout.str()},
                         {"devices", devices},
                         {"after_step", at}});
  for (size_t r = 0; r < j->ranks.size(); ++r)
    out->drains.push_back({job_id, j->generation, static_cast<int>(r), at});
  return true;
}

void CoordinatorState::grow(Actions* out) {
  for (const auto& id : order_) {
    Job& j = jobs_.at(id);
    if (j.state != JobState::running || j.drain_step >= 0 || j.last_step < 0) continue;
    int max_devices = j.request.max_devices > 0 ? j.request.max_devices : j.request.layout.world();
    const int unit = j.layout.pp * j.layout.tp;
    int want = max_devices / unit;
    if (want <= j.layout.dp) continue;
    bool someone_waits = false;
    for (const auto& [qid, q] : jobs_)
      someone_waits =
          someone_waits || (q.state == JobState::queued && q.request.device_kind == j.request.device_kind);
    if (someone_waits) continue;
    int d = fit_dp(j, want, registry_.free(j.request.device_kind) + j.layout.world());
    if (d <= j.layout.dp) continue;
    std::string why;
    scale(j.id, d * unit, out, &why);  // a job too close to its end just finishes
  }
}

std::string CoordinatorState::store_refusal(const std::string& job_id, int generation) const {
  const Job* j = job(job_id);
  if (!j) return "unknown job '" + job_id + "'";
  if (j->generation != generation)
    return "stale generation " + std::to_string(generation) + " (job is at generation " +
           std::to_string(j->generation) + ")";
  if (is_terminal(j->state)) return "job already " + std::string(to_string(j->state));
  return "";
}

// ---------------------------------------------------------------- persistence

namespace {

constexpr int kTableFormat = 1;

nlohmann::json layout_json(const Layout& l) { return {l.dp, l.pp, l.tp}; }

Layout layout_from(const nlohmann::json& x) {
  TROUPE_CHECK(x.is_array() && x.size() == 3, "bad layout in the job table: ", x.dump());
  Layout l{x[0].get<int>(), x[1].get<int>(), x[2].get<int>()};
  TROUPE_CHECK(l.dp > 0 && l.pp > 0 && l.tp > 0, "bad layout in the job table: ", x.dump());
  return l;
}

JobState state_from(const std::string& name) {
  for (JobState s : {JobState::queued, JobState::planning, JobState::launching, JobState::running,
                     JobState::recovering, JobState::succeeded, JobState::failed, JobState::cancelled})
    if (name == to_string(s)) return s;
  TROUPE_CHECK(false, "unknown job state '", name, "' in the job table");
  return JobState::failed;
}

nlohmann::json request_json(const JobRequest& r) {
  return {{"name", r.name},
          {"spec_yaml", r.spec_yaml},
          {"device_kind", r.device_kind},
          {"layout", layout_json(r.layout)},
          {"n_layers", r.n_layers},
          {"total_steps", r.total_steps},
          {"resume_from", r.resume_from},
          {"checkpoint_dir", r.checkpoint_dir},
          {"checkpoint_keep", r.checkpoint_keep},
          {"max_restarts", r.max_restarts},
          {"restart_backoff_ms", r.restart_backoff_ms},
          {"step_timeout_ms", r.step_timeout_ms},
          {"replacement_wait_ms", r.replacement_wait_ms},
          {"min_devices", r.min_devices},
          {"max_devices", r.max_devices},
          {"global_batch", r.global_batch},
          {"micro_batch", r.micro_batch}};
}

JobRequest request_from(const nlohmann::json& x) {
  JobRequest r;
  r.name = x.at("name").get<std::string>();
  r.spec_yaml = x.at("spec_yaml").get<std::string>();
  r.device_kind = x.at("device_kind").get<std::string>();
  r.layout = layout_from(x.at("layout"));
  r.n_layers = x.at("n_layers").get<int>();
  r.total_steps = x.at("total_steps").get<int64_t>();
  r.resume_from = x.at("resume_from").get<std::string>();
  r.checkpoint_dir = x.at("checkpoint_dir").get<std::string>();
  r.checkpoint_keep = x.value("checkpoint_keep", 0);
  r.max_restarts = x.at("max_restarts").get<int>();
  r.restart_backoff_ms = x.at("restart_backoff_ms").get<double>();
  r.step_timeout_ms = x.at("step_timeout_ms").get<double>();
  r.replacement_wait_ms = x.at("replacement_wait_ms").get<double>();
  r.min_devices = x.at("min_devices").get<int>();
  r.max_devices = x.at("max_devices").get<int>();
  r.global_batch = x.at("global_batch").get<int>();
  r.micro_batch = x.at("micro_batch").get<int>();
  return r;
}

}  // namespace

nlohmann::json CoordinatorState::table_json() const {
  nlohmann::json jobs = nlohmann::json::array();
  for (const auto& id : order_) {
    const Job& j = jobs_.at(id);
    jobs.push_back({{"id", j.id},
                    {"request", request_json(j.request)},
                    {"state", to_string(j.state)},
                    {"reason", j.reason},
                    {"failure_name", j.failure_name},
                    {"layout", layout_json(j.layout)},
                    {"generation", j.generation},
                    {"restarts", j.restarts},
                    {"run_dir", j.run_dir},
                    {"resume_from", j.resume_from},
                    {"target_dp", j.target_dp},
                    {"failures", j.failures},
                    {"last_step", j.last_step},
                    {"last_loss", j.last_loss},
                    {"control_messages", j.control_messages},
                    {"submitted_ms", j.submitted_ms},
                    {"first_step_ms", j.first_step_ms},
                    {"finished_ms", j.finished_ms}});
  }
  return {{"format", kTableFormat}, {"jobs", jobs}};
}

void CoordinatorState::load_table(const nlohmann::json& table, Actions* out) {
  TROUPE_CHECK(jobs_.empty(), "a job table is loaded only into a coordinator without jobs");
  TROUPE_CHECK(table.is_object() && table.value("format", 0) == kTableFormat && table.contains("jobs") &&
                   table["jobs"].is_array(),
               "not a troupe job table (format ", kTableFormat, ")");
  const double now = now_ms();
  std::vector<Job> loaded;
  try {
    for (const auto& x : table["jobs"]) {
      Job j;
      j.id = x.at("id").get<std::string>();
      TROUPE_CHECK(!j.id.empty(), "a job without an id in the job table");
      j.request = request_from(x.at("request"));
      j.state = state_from(x.at("state").get<std::string>());
      j.reason = x.at("reason").get<std::string>();
      j.failure_name = x.at("failure_name").get<std::string>();
      j.layout = layout_from(x.at("layout"));
      j.generation = x.at("generation").get<int>();
      j.restarts = x.at("restarts").get<int>();
      j.run_dir = x.at("run_dir").get<std::string>();
      j.resume_from = x.at("resume_from").get<std::string>();
      j.target_dp = x.at("target_dp").get<int>();
      for (const auto& f : x.at("failures")) j.failures.push_back(f);
      j.last_step = x.at("last_step").get<int64_t>();
      j.last_loss = x.at("last_loss").get<double>();
      j.control_messages = x.at("control_messages").get<int64_t>();
      j.submitted_ms = x.at("submitted_ms").get<double>();
      j.first_step_ms = x.at("first_step_ms").get<double>();
      j.finished_ms = x.at("finished_ms").get<double>();
      loaded.push_back(std::move(j));
    }
  } catch (const nlohmann::json::exception& e) {
    TROUPE_CHECK(false, "malformed job table: ", e.what());
  }
  for (auto& j : loaded) {
    TROUPE_CHECK(!jobs_.count(j.id), "job ", j.id, " appears twice in the job table");
    if (!is_terminal(j.state) && j.state != JobState::queued) {
      // The old generation's workers were killed by their agents when the
      // coordinator went away; a recovering job had not launched its next one yet.
      if (j.state != JobState::recovering) ++j.generation;
      j.state = JobState::recovering;
      j.reason = "coordinator restarted: relaunching as generation " + std::to_string(j.generation) +
                 " from the newest verified checkpoint";
      j.drain_step = -1;
      j.relaunch_at_ms = now;
      j.recovery_deadline_ms = now + j.request.replacement_wait_ms;
      out->events.push_back(
          {{"event", "state"}, {"job", j.id}, {"state", "recovering"}, {"reason", j.reason}});
    }
    order_.push_back(j.id);
    std::string id = j.id;
    jobs_[id] = std::move(j);
  }
}

std::string state_file(const std::string& state_dir) { return state_dir + "/jobs.json"; }

void save_table(const std::string& state_dir, const nlohmann::json& table) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  TROUPE_CHECK(!ec, "cannot create the state directory ", state_dir, ": ", ec.message());
  const std::string path = state_file(state_dir), tmp = path + ".tmp";
  const std::string text = table.dump(1) + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TROUPE_CHECK(fd >= 0, "cannot write ", tmp, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      TROUPE_CHECK(false, "cannot write ", tmp, ": ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  bool synced = ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  TROUPE_CHECK(synced, "cannot fsync ", tmp, ": ", std::strerror(err));
  TROUPE_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, ": ",
               std::strerror(errno));
  // The rename itself is durable only once the directory is synced.
  int dfd = ::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

nlohmann::json load_table_file(const std::string& state_dir) {
  const std::string path = state_file(state_dir);
  if (!std::filesystem::exists(path)) return nullptr;
  std::ifstream in(path);
  TROUPE_CHECK(in.good(), "cannot read ", path);
  auto table = nlohmann::json::parse(in, nullptr, false);
  TROUPE_CHECK(!table.is_discarded(), "the job table ", path, " is not valid JSON");
  return table;
}

// ---------------------------------------------------------------- queries

nlohmann::json CoordinatorState::job_json(const Job& j) const {
  nlohmann::json workers = nlohmann::json::array();
  for (size_t r = 0; r < j.ranks.size(); ++r) {
    const RankSlot& s = j.ranks[r];
    workers.push_back({{"rank", r},
                       {"agent", s.device.agent_id},
                       {"host", s.host},
                       {"device", s.device.device},
                       {"pid", s.pid},
                       {"where", s.where},
                       {"registered", s.registered},
                       {"done", s.done},
                       {"exited", s.exited}});
  }
  nlohmann::json out = {{"id", j.id},
                        {"name", j.request.name},
                        {"state", to_string(j.state)},
                        {"reason", j.reason},
                        {"failure", j.failure_name},
                        {"layout", j.layout.str()},
                        {"planned_layout", j.request.layout.str()},
                        {"world", j.layout.world()},
                        {"restarts", j.restarts},
                        {"max_restarts", j.request.max_restarts},
                        {"resume_from", j.resume_from},
                        {"failures", j.failures},
                        {"device_kind", j.request.device_kind},
                        {"generation", j.generation},
                        {"run_dir", j.run_dir},
                        {"steps_done", j.last_step + 1},
                        {"total_steps", j.request.total_steps},
                        {"control_messages", j.control_messages},
                        {"workers", workers}};
  if (j.last_step >= 0) out["loss"] = j.last_loss;
  if (j.first_step_ms > 0) out["first_step_latency_ms"] = j.first_step_ms - j.submitted_ms;
  if (j.finished_ms > 0) out["duration_ms"] = j.finished_ms - j.submitted_ms;
  return out;
}

nlohmann::json CoordinatorState::list_json() const {
  nlohmann::json jobs = nlohmann::json::array();
  for (const auto& id : order_) {
    const Job& j = jobs_.at(id);
    jobs.push_back({{"id", j.id},
                    {"name", j.request.name},
                    {"state", to_string(j.state)},
                    {"reason", j.reason},
                    {"layout", j.layout.str()},
                    {"generation", j.generation},
                    {"steps_done", j.last_step + 1},
                    {"total_steps", j.request.total_steps}});
  }
  nlohmann::json devices;
  for (const char* kind : {"cpu", "cuda"})
    devices[kind] = {{"total", registry_.total(kind)}, {"free", registry_.free(kind)}};
  return {{"jobs", jobs}, {"agents", registry_.to_json()}, {"devices", devices}};
}

}  // namespace troupe::coord
