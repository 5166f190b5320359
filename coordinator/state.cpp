// CoordinatorState: agents, the job state machine and the workers' reports.
// Recovery, the watchdog and resizing are in state_recovery.cpp, the job table
// in state_persist.cpp, the JSON views in state_views.cpp; the policy they
// apply is coordinator/policy.hpp.
#include "coordinator/state.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "actors/version.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/verified.hpp"
#include "coordinator/policy.hpp"
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
    case SIGSTOP:
      return "SIGSTOP";
    case SIGTSTP:
      return "SIGTSTP";
    case SIGTTIN:
      return "SIGTTIN";
    case SIGTTOU:
      return "SIGTTOU";
    default:
      return "signal " + std::to_string(sig);
  }
}

void Actions::append(Actions&& o) {
  for (auto& x : o.launches) launches.push_back(std::move(x));
  for (auto& x : o.aborts) aborts.push_back(std::move(x));
  for (auto& x : o.kills) kills.push_back(std::move(x));
  for (auto& x : o.drains) drains.push_back(std::move(x));
  for (auto& x : o.reassigns) reassigns.push_back(std::move(x));
  for (auto& x : o.releases) releases.push_back(std::move(x));
  for (auto& x : o.events) events.push_back(std::move(x));
}

CoordinatorState::CoordinatorState(std::string runs_root, int protocol_version)
    : runs_root_(std::move(runs_root)),
      protocol_(protocol_version),
      make_id_(make_job_id),
      verified_(std::make_shared<checkpoint::VerifiedCheckpoints>()),
      find_checkpoint_([v = verified_](const std::string& root, std::vector<std::string>* skipped) {
        return v->latest_valid(root, skipped).value_or("");
      }) {
  std::error_code ec;
  auto abs = std::filesystem::absolute(runs_root_, ec);
  if (!ec) runs_root_ = abs.lexically_normal().string();
}

void CoordinatorState::checkpoint_committed(const std::string& dir) { verified_->verify_later(dir); }

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
    j->survivors.erase(std::remove_if(j->survivors.begin(), j->survivors.end(),
                                      [&](const Survivor& v) { return v.device.agent_id == agent_id; }),
                       j->survivors.end());
    j->spares.erase(std::remove_if(j->spares.begin(), j->spares.end(),
                                   [&](const Spare& v) { return v.device.agent_id == agent_id; }),
                    j->spares.end());
    int first = -1;
    for (size_t r = 0; r < j->ranks.size(); ++r)
      if (j->ranks[r].device.agent_id == agent_id) {
        j->ranks[r].exited = true;
        if (first < 0) first = static_cast<int>(r);
      }
    // An agent that held only the job's spares (or survivors of a recovering job) fails nothing.
    if (j->state == JobState::recovering || first < 0) continue;
    on_failure(*j, FailureCause::agent_lost, "agent " + who + " disconnected", first, out);
  }
  schedule(out);
}

// ---------------------------------------------------------------- jobs

Job* CoordinatorState::find(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

Job* CoordinatorState::rank_job(const std::string& job_id, int generation, int rank) {
  Job* j = find(job_id);
  if (!j || j->generation != generation || rank < 0 || rank >= static_cast<int>(j->ranks.size()))
    return nullptr;
  return j;
}

Job* CoordinatorState::live_rank_job(const std::string& job_id, int generation, int rank) {
  Job* j = rank_job(job_id, generation, rank);
  return j && !is_terminal(j->state) ? j : nullptr;
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
  j.spec_yaml = j.request.spec_yaml;
  j.resume_from = j.request.resume_from;
  j.run_dir = runs_root_ + "/" + j.request.name + "-" + id;
  j.submitted_ms = now_ms();
  order_.push_back(id);
  out->events.push_back({{"event", "submitted"},
                         {"job", id},
                         {"name", j.request.name},
                         {"run_dir", j.run_dir},
                         {"layout", j.request.auto_plan ? std::string("auto") : j.request.layout.str()},
                         {"spec", j.request.spec_yaml}});
  out->events.push_back({{"event", "state"}, {"job", id}, {"state", "queued"}, {"reason", ""}});
  schedule(out);
  return id;
}

void CoordinatorState::transition(Job& job, JobState to, const std::string& reason, Actions* out) {
  if (!transition_allowed(job.state, to)) throw IllegalTransition(job.state, to);
  job.state = to;
  job.reason = reason;
  job.waiting_told.clear();  // the new state has told no wait yet
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
  std::optional<std::vector<DeviceRef>> devices;
  if (req.auto_plan) {
    // The planner chooses the layout for the devices that are free now.
    const int free = registry_.free(req.device_kind);
    if (free < auto_min_devices(job)) {
      why = "waiting for devices: " + std::to_string(free) + " " + req.device_kind + " free, the job needs " +
            std::to_string(auto_min_devices(job)) + " or more (elastic.min_devices)";
    } else if (auto c = plan_auto(job, auto_devices(job, free), &why)) {
      devices = registry_.allocate(job.id, req.device_kind, c->layout.world(), &why, req.spread);
      if (devices) {
        job.layout = c->layout;
        job.choice = std::move(c);
      }
    }
  } else {
    // The spares' devices too: a job runs on what it asks for.
    devices = registry_.allocate(job.id, req.device_kind, job.layout.world() + req.spares, &why, req.spread);
    if (!devices && req.spares > 0)
      why += " (" + std::to_string(job.layout.world()) + " rank(s) and " + std::to_string(req.spares) +
             " spare(s): resources.spares)";
  }
  if (!devices) {
    job.reason = why;
    tell_waiting(job, "queued", now_ms(), out);
    return false;
  }
  transition(job, JobState::planning, "", out);
  const std::vector<DeviceRef> spare_devices(devices->begin() + job.layout.world(), devices->end());
  devices->resize(size_t(job.layout.world()));
  launch(job, *devices, out);
  launch_spares(job, spare_devices, out);
  return true;
}

void CoordinatorState::launch(Job& job, const std::vector<DeviceRef>& devices, Actions* out) {
  // The generation's plan, once: every rank gets it in its Assignment and status shows it.
  try {
    if (job.choice) {
      // An auto job: the planner's choice, its spec written in (plan::resolve).
      const Job::Choice c = std::move(*job.choice);
      job.choice.reset();
      job.plan =
          plan::make_plan(plan::plan_inputs(parse_spec(c.spec_yaml, job.request.name + " (planned spec)")),
                          job.layout, c.micro_batch, c.boundaries);
      job.spec_yaml = c.spec_yaml;
      job.predicted_step_s = c.event.value("predicted_step_s", 0.0);
      if (job.first_devices == 0) job.first_devices = job.layout.world();
      nlohmann::json ev = c.event;
      ev["generation"] = job.generation;
      job.planned = ev;
      out->events.push_back(std::move(ev));
    } else {
      job.plan = plan::make_plan(job.request.plan, job.layout);
      job.spec_yaml = job.request.spec_yaml;
    }
  } catch (const std::exception& e) {
    job.ranks.clear();
    fail(job, FailureCause::invalid_spec, "no plan for layout " + job.layout.str() + ": " + e.what(), out);
    return;
  }
  job.ranks.assign(devices.size(), RankSlot{});
  job.peer_report.reset();
  for (size_t r = 0; r < devices.size(); ++r) {
    job.ranks[r].device = devices[r];
    job.ranks[r].launch_generation = job.generation;
    job.ranks[r].launch_rank = static_cast<int>(r);
    if (const Agent* a = registry_.agent(devices[r].agent_id)) job.ranks[r].host = a->host;
  }
  choose_buddies(job);
  // A place whose process runs already (a survivor's, a spare's) is registered at once; its
  // agent keeps knowing the process by its launch.
  std::vector<bool> kept(devices.size(), false);
  auto adopt = [&](int rank, const DeviceRef& device, int pid, const std::string& host, int launch_generation,
                   int launch_rank) {
    if (rank < 0 || rank >= static_cast<int>(devices.size()) || kept[rank] || !(devices[rank] == device))
      return false;
    RankSlot& slot = job.ranks[rank];
    slot.registered = true;
    slot.pid = pid;
    slot.host = host;
    slot.launch_generation = launch_generation;
    slot.launch_rank = launch_rank;
    kept[rank] = true;
    return true;
  };
  // Survivors of the failed generation keep their rank, device and process.
  std::vector<Actions::Reassign> reassigns;
  for (const Survivor& v : job.survivors)
    if (adopt(v.rank, v.device, v.pid, v.host, v.launch_generation, v.launch_rank))
      reassigns.push_back({job.id, v.generation, v.rank, v.rank, job.generation});
  // Spares take the places the relaunch gave them (try_relaunch: place_spares).
  int n_spares = 0;
  for (Spare& v : job.spares) {
    if (v.rank < 0) continue;
    if (adopt(v.rank, v.device, v.pid, v.host, v.launch_generation, v.launch_rank))
      ++n_spares;
    else
      v.rank = -1;
  }
  job.metrics = std::make_unique<MetricsAggregator>(job.layout.world(), job.generation, job.layout.str());
  job.stepped = false;
  std::string placed;
  for (size_t r = 0; r < devices.size(); ++r)
    placed += (r ? ", " : "") + std::to_string(r) + "=" + job.ranks[r].host + "/" + devices[r].device;
  std::string from = job.resume_from.empty() ? "" : ", resuming from " + job.resume_from;
  const int n_kept = static_cast<int>(std::count(kept.begin(), kept.end(), true));
  if (n_kept - n_spares > 0) from += ", " + std::to_string(n_kept - n_spares) + " rank(s) kept their process";
  if (n_spares > 0) from += ", " + std::to_string(n_spares) + " place(s) taken by a spare";
  transition(job, JobState::launching,
             "generation " + std::to_string(job.generation) + ": placed " + job.layout.str() + " on " +
                 placed + from,
             out);
  job.last_progress_ms = 0;
  // Logs of later generations go beside the first one's: workers/<rank>.g<generation>.log.
  std::string suffix = job.generation == 0 ? "" : ".g" + std::to_string(job.generation);
  for (size_t r = 0; r < devices.size(); ++r) {
    if (kept[r]) continue;
    out->launches.push_back({devices[r].agent_id, job.id, job.generation, static_cast<int>(r),
                             devices[r].device,
                             job.run_dir + "/workers/" + std::to_string(r) + suffix + ".log"});
  }
  for (auto& r : reassigns) out->reassigns.push_back(std::move(r));
  job.survivors.clear();
  // A spare that took a place is a rank now: its agent still knows it by its launch.
  for (auto it = job.spares.begin(); it != job.spares.end();) {
    if (it->rank < 0) {
      ++it;
      continue;
    }
    out->reassigns.push_back({job.id, it->launch_generation, it->launch_rank, it->rank, job.generation});
    it = job.spares.erase(it);
  }
  if (n_kept == static_cast<int>(devices.size())) {
    transition(
        job, JobState::running,
        std::to_string(devices.size()) + " worker(s) running, generation " + std::to_string(job.generation),
        out);
    job.last_progress_ms = now_ms();
  }
}

// Adds the launch (generation, rank) to the kill of its agent.
static void kill_launch(std::vector<Kill>& kills, const std::string& agent_id, const std::string& job_id,
                        int generation, int rank) {
  auto k = std::find_if(kills.begin(), kills.end(),
                        [&](const Kill& x) { return x.agent_id == agent_id && x.job_id == job_id; });
  if (k == kills.end()) k = kills.insert(kills.end(), Kill{agent_id, job_id, {}, {}});
  k->generations.push_back(generation);
  k->ranks.push_back(rank);
}

void CoordinatorState::stop_workers(Job& job, const std::string& reason, Actions* out) {
  std::vector<Kill> kills;
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    const RankSlot& s = job.ranks[r];
    if (s.exited) continue;
    if (s.registered && !s.done) out->aborts.push_back({job.id, job.generation, static_cast<int>(r), reason});
    const bool survives = std::any_of(job.survivors.begin(), job.survivors.end(), [&](const Survivor& v) {
      return v.rank == static_cast<int>(r) && v.generation == job.generation;
    });
    if (!survives && registry_.agent(s.device.agent_id))
      kill_launch(kills, s.device.agent_id, job.id, s.launch_generation, s.launch_rank);
  }
  for (auto& k : kills) out->kills.push_back(std::move(k));
}

void CoordinatorState::keep_survivors(Job& job, int blamed) {
  job.survivors.clear();
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    const RankSlot& s = job.ranks[r];
    if (static_cast<int>(r) == blamed || !s.registered || s.done || s.exited) continue;
    job.survivors.push_back(Survivor{static_cast<int>(r), job.generation, s.launch_generation, s.launch_rank,
                                     s.pid, s.device, s.host, s.stays, s.memory});
  }
}

void CoordinatorState::drop_survivors(Job& job, const std::function<bool(const Survivor&)>& drop,
                                      const std::string& why, Actions* out) {
  std::vector<Kill> kills;
  for (auto it = job.survivors.begin(); it != job.survivors.end();) {
    if (!drop(*it)) {
      ++it;
      continue;
    }
    out->releases.push_back({job.id, it->generation, it->rank, why});
    if (registry_.agent(it->device.agent_id))
      kill_launch(kills, it->device.agent_id, job.id, it->launch_generation, it->launch_rank);
    registry_.release_device(job.id, it->device);
    it = job.survivors.erase(it);
  }
  for (auto& k : kills) out->kills.push_back(std::move(k));
}

void CoordinatorState::end_generation(Job& job, JobState to, const std::string& reason,
                                      const std::string& abort_reason, double relaunch_at_ms, Actions* out) {
  transition(job, to, reason, out);
  // A job that ends releases the processes it kept for its next generation.
  if (to != JobState::recovering) {
    drop_survivors(
        job, [](const Survivor&) { return true; }, "job " + std::string(to_string(to)), out);
    while (!job.spares.empty())
      drop_spare(job, job.spares.back().launch_generation, job.spares.back().launch_rank,
                 "job " + std::string(to_string(to)), true, true, out);
  }
  if (!abort_reason.empty()) stop_workers(job, abort_reason, out);
  std::vector<DeviceRef> keep;
  for (const Survivor& v : job.survivors) keep.push_back(v.device);
  for (const Spare& v : job.spares) keep.push_back(v.device);
  registry_.release(job.id, keep);
  store_.drop_job(job.id);
  if (to == JobState::recovering) {
    ++job.generation;
    job.drain_step = -1;
    job.relaunch_at_ms = relaunch_at_ms;
    job.recovery_deadline_ms = std::max(relaunch_at_ms, now_ms()) + job.request.replacement_wait_ms;
    if (relaunch_at_ms > 0) return;
  }
  schedule(out);
}

void CoordinatorState::fail(Job& job, FailureCause cause, const std::string& message, Actions* out) {
  if (is_terminal(job.state)) return;
  job.failure = cause;
  const std::string name = to_string(cause);
  end_generation(job, JobState::failed, name + ": " + message, "job failed: " + name, 0, out);
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
  end_generation(*j, JobState::cancelled, reason, "job cancelled", 0, out);
  return true;
}

// ---------------------------------------------------------------- workers

void CoordinatorState::worker_launched(const std::string& job_id, int generation, int rank, int pid) {
  if (actors::is_spare_rank(rank)) {
    if (Job* j = find(job_id))
      if (Spare* v = find_spare(*j, generation, rank)) v->pid = pid;
    return;
  }
  if (Job* j = rank_job(job_id, generation, rank)) j->ranks[rank].pid = pid;
}

void CoordinatorState::launch_failed(const std::string& job_id, int generation, int rank,
                                     const std::string& message, Actions* out) {
  if (actors::is_spare_rank(rank)) {
    if (Job* j = find(job_id)) drop_spare(*j, generation, rank, message, false, false, out);
    return;
  }
  Job* j = rank_job(job_id, generation, rank);
  if (!j) return;
  j->ranks[rank].exited = true;
  on_failure(*j, FailureCause::launch_failed, "rank " + std::to_string(rank) + ": " + message, rank, out);
}

WorkerAssignment CoordinatorState::register_worker(int protocol, const std::string& job_id, int generation,
                                                   int rank, const std::string& host, int pid, Actions* out) {
  WorkerAssignment a;
  if (protocol != protocol_) {
    a.refused = "protocol version mismatch: the worker speaks protocol " + std::to_string(protocol) +
                ", the coordinator speaks protocol " + std::to_string(protocol_) +
                "; run the same troupe version on every node";
    if (Job* j = find(job_id); j && j->generation == generation)
      fail(*j, FailureCause::protocol_mismatch, "rank " + std::to_string(rank) + ": " + a.refused, out);
    return a;
  }
  Job* j = find(job_id);
  if (!j) {
    a.refused = "unknown job '" + job_id + "'";
    return a;
  }
  if (actors::is_spare_rank(rank)) {
    // A spare waits for a place, across generations: it is known by its launch.
    Spare* v = is_terminal(j->state) ? nullptr : find_spare(*j, generation, rank);
    if (!v || v->ready) {
      a.refused = "job " + job_id + " has no spare " + std::to_string(rank - actors::kFirstSpareRank) +
                  " of generation " + std::to_string(generation) + " waiting to register";
      return a;
    }
    v->ready = true;
    v->pid = pid;
    if (!host.empty()) v->host = host;
    ++j->control_messages;
    out->events.push_back(
        {{"event", "log"},
         {"job", job_id},
         {"message", "spare " + std::to_string(rank - actors::kFirstSpareRank) + " (pid " +
                         std::to_string(pid) + ", " + v->device.device + " on " + v->host + ") is ready"}});
    a.job = j;
    a.rank = rank;
    a.spare = true;
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
  // launch() planned this generation before any worker could start; a job without a plan
  // for its layout has no rank to give.
  if (j->plan.layout != j->layout || j->plan.partition.chunks.empty() ||
      static_cast<int>(j->ranks.size()) != j->plan.layout.world()) {
    a.refused = "job " + job_id + " generation " + std::to_string(generation) + " has no plan";
    return a;
  }
  a.place = plan::rank_place(j->plan, rank);
  s.registered = true;
  s.pid = pid;
  if (!host.empty()) s.host = host;
  ++j->control_messages;
  a.job = j;
  a.rank = rank;
  // Stops at the first rank still to come: registrations arrive in any order, so the walk is
  // short until the last ones (a whole walk per registration was O(N^2) per launch).
  const bool all =
      std::all_of(j->ranks.begin(), j->ranks.end(), [](const RankSlot& r) { return r.registered; });
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
  Job* j = live_rank_job(job_id, generation, sample.rank);
  if (!j || !j->metrics) return;
  ++j->control_messages;
  auto line = j->metrics->add(sample);
  if (!line) return;
  j->last_step = sample.step;
  j->stepped = true;
  j->memory_failed = false;
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

void CoordinatorState::worker_done(const std::string& job_id, int generation, int rank, bool drained,
                                   Actions* out) {
  Job* j = live_rank_job(job_id, generation, rank);
  if (!j) return;
  ++j->control_messages;
  RankSlot& s = j->ranks[rank];
  s.done = true;
  s.drained = drained;
  s.where = drained ? "drained" : "finished";
  bool resized = false;
  for (const auto& r : j->ranks) {
    if (!r.done) return;
    resized = resized || r.drained;
  }
  if (resized) {
    // Every rank checkpointed after the drain step: relaunch at the new size at once.
    end_generation(*j, JobState::recovering,
                   (j->request.auto_plan ? "resize: " + std::to_string(j->layout.world()) + " -> " +
                                               std::to_string(j->target_devices) + " devices (replanned)"
                                         : "resize: data " + std::to_string(j->layout.dp) + " -> " +
                                               std::to_string(j->target_dp)) +
                       " after the checkpoint of step " + std::to_string(j->drain_step),
                   "", 0, out);
    return;
  }
  end_generation(*j, JobState::succeeded, std::to_string(j->last_step + 1) + " step(s)", "", 0, out);
}

void CoordinatorState::worker_failed(const std::string& job_id, int generation, int rank, FailureCause cause,
                                     const std::string& message, Actions* out, bool stays,
                                     const MemoryHeld& memory) {
  // Only a rank its generation ended under may stay (core/failure.hpp: survivable); a stay
  // that no later generation takes is answered at once, so that the process exits.
  stays = stays && survivable(cause);
  auto release = [&](const std::string& why) {
    if (stays) out->releases.push_back({job_id, generation, rank, why});
  };
  Job* old = find(job_id);
  if (!old) return;
  if (is_terminal(old->state)) return release("job " + std::string(to_string(old->state)));
  if (old->generation != generation) {
    // The report of a generation that already ended: a survivor says it is ready, or going.
    for (auto it = old->survivors.begin(); it != old->survivors.end(); ++it) {
      if (it->generation != generation || it->rank != rank) continue;
      if (stays) {
        it->parked = true;
        it->memory = memory;
        // The last survivor to report may let the relaunch go now rather than at the next tick.
        if (old->state == JobState::recovering) try_relaunch(*old, now_ms(), out);
      } else {
        registry_.release_device(old->id, it->device);  // its process exits
        old->survivors.erase(it);
      }
      return;
    }
    return release("generation " + std::to_string(generation) + " ended and no later one keeps it");
  }
  Job* j = live_rank_job(job_id, generation, rank);
  if (!j) return;
  ++j->control_messages;
  if (stays) {
    // A peer failed it: the peer's own report (its exit, its lost connection) names the
    // culprit, and usually follows within milliseconds. tick() decides if none does.
    j->ranks[rank].stays = true;
    j->ranks[rank].memory = memory;
    if (!j->peer_report && j->state != JobState::recovering)
      j->peer_report =
          Job::PeerReport{rank, cause, "rank " + std::to_string(rank) + ": " + message, now_ms()};
    return;
  }
  on_failure(*j, cause, "rank " + std::to_string(rank) + ": " + message, rank, out);
}

void CoordinatorState::survivor_lost(const std::string& job_id, int generation, int rank, Actions* out) {
  Job* j = find(job_id);
  if (!j) return;
  if (actors::is_spare_rank(rank))
    return drop_spare(*j, generation, rank, "its connection to the coordinator broke", true, false, out);
  drop_survivors(
      *j, [&](const Survivor& v) { return v.generation == generation && v.rank == rank; },
      "its connection to the coordinator broke", out);
}

int CoordinatorState::launched_rank(const Job& j, int generation, int rank) {
  // A rank is found by its launch (a spare that took a place has a spare's launch rank).
  auto launched_as = [&](int r) {
    return r >= 0 && r < static_cast<int>(j.ranks.size()) && j.ranks[r].launch_generation == generation &&
           j.ranks[r].launch_rank == rank;
  };
  if (launched_as(rank)) return rank;
  if (!actors::is_spare_rank(rank)) return -1;
  for (int r = 0; r < static_cast<int>(j.ranks.size()); ++r)
    if (launched_as(r)) return r;
  return -1;
}

void CoordinatorState::worker_exited(const std::string& job_id, int generation, int rank, int pid,
                                     int exit_code, int signal, Actions* out) {
  // The agent names a process by its launch: a survivor launched in an earlier generation
  // now runs the job's current one, or waits for it.
  Job* j = find(job_id);
  if (!j) return;
  if (find_spare(*j, generation, rank)) {
    const std::string how =
        signal > 0 ? "was killed by " + signal_name(signal) : "exited with code " + std::to_string(exit_code);
    return drop_spare(*j, generation, rank, "its process " + how, false, false, out);
  }
  for (auto it = j->survivors.begin(); it != j->survivors.end(); ++it)
    if (it->launch_generation == generation && it->launch_rank == rank) {
      registry_.release_device(j->id, it->device);
      j->survivors.erase(it);
      return;
    }
  // The ranks of a recovering job are those of the generation that ended: news of them changes
  // nothing.
  if (j->state == JobState::recovering) return;
  rank = launched_rank(*j, generation, rank);
  if (rank < 0) return;
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
  on_failure(*j, signal > 0 ? FailureCause::worker_killed : FailureCause::worker_exited,
             where + how + " before finishing", rank, out);
}

void CoordinatorState::worker_lost(const std::string& job_id, int generation, int rank,
                                   const std::string& why, Actions* out) {
  if (actors::is_spare_rank(rank)) return survivor_lost(job_id, generation, rank, out);
  // A rank whose generation ended before its loss was noticed: a survivor no more.
  if (const Job* k = job(job_id); k && k->generation != generation)
    return survivor_lost(job_id, generation, rank, out);
  Job* j = live_rank_job(job_id, generation, rank);
  if (!j) return;
  const RankSlot& s = j->ranks[rank];
  if (s.done || s.exited) return;
  on_failure(*j, FailureCause::worker_lost,
             "rank " + std::to_string(rank) + " (pid " + std::to_string(s.pid) + ", " + s.device.device +
                 " on " + s.host + ") lost its connection: " + why,
             rank, out);
}

void CoordinatorState::worker_stopped(const std::string& job_id, int generation, int rank, int pid,
                                      int signal, int stopped_ms, Actions* out) {
  Job* j = find(job_id);
  if (!j) return;
  char for_s[32];
  std::snprintf(for_s, sizeof for_s, "%.1f", stopped_ms / 1000.0);
  const std::string how = "was stopped by " + signal_name(signal) + " for " + for_s + " s";
  if (find_spare(*j, generation, rank))
    return drop_spare(*j, generation, rank, "its process " + how, true, true, out);
  const auto this_launch = [&](const Survivor& v) {
    return v.launch_generation == generation && v.launch_rank == rank;
  };
  if (std::any_of(j->survivors.begin(), j->survivors.end(), this_launch))
    return drop_survivors(*j, this_launch, "its process " + how, out);
  if (is_terminal(j->state) || j->state == JobState::recovering) return;
  rank = launched_rank(*j, generation, rank);
  if (rank < 0) return;
  const RankSlot& s = j->ranks[rank];
  if (s.done || s.exited) return;
  on_failure(*j, FailureCause::worker_stopped,
             "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ", " + s.device.device +
                 " on " + s.host + ") " + how + " (hung; its agent saw it stopped)",
             rank, out);
}

void CoordinatorState::worker_where(const std::string& job_id, int generation, int rank,
                                    const std::string& where, double now) {
  Job* j = rank_job(job_id, generation, rank);
  if (!j) return;
  RankSlot& s = j->ranks[rank];
  if (j->state == JobState::running && j->last_progress_ms > 0 && where != s.where &&
      where.rfind("eval batch ", 0) == 0)
    j->last_progress_ms = std::max(j->last_progress_ms, now);
  s.where = where;
  s.where_ms = now;
}

// ---------------------------------------------------------------- rendezvous

std::string CoordinatorState::store_refusal(const std::string& job_id, int generation) const {
  const Job* j = job(job_id);
  if (!j) return "unknown job '" + job_id + "'";
  if (j->generation != generation)
    return "stale generation " + std::to_string(generation) + " (job is at generation " +
           std::to_string(j->generation) + ")";
  if (is_terminal(j->state)) return "job already " + std::string(to_string(j->state));
  return "";
}

}  // namespace troupe::coord
