// CoordinatorState's clock: recovery of failed generations (restart or fail,
// relaunch on the devices there are), the step watchdog, and resizing. The
// decisions are coordinator/policy.hpp's; this file applies them.
#include <algorithm>
#include <cstdio>
#include <map>

#include "coordinator/policy.hpp"
#include "coordinator/state.hpp"
#include "coordinator/where_polls.hpp"
#include "core/buddy_ring.hpp"

namespace troupe::coord {

// How long a relaunch that keeps survivors waits past its backoff for their reports.
constexpr double kSurvivorReportMs = 2000;
// A rank whose last "where" answer is older than the newest one by this many rounds of polls
// (where_polls.hpp: at most 500 ms up to 2,045 ranks, then longer) has stopped answering.
constexpr double kStaleWhereRounds = 3;
// A "waiting" event tells a change of the reason at most this often (tell_waiting).
constexpr double kWaitingEventMs = 1000;
// How long a peer-caused failure report waits for a direct report that names the culprit.
// Longer than the shell's wait for a lost connection's exit report (250 ms) and a reaping
// period, so that a culprit seen only through its connection is still the one named.
constexpr double kPeerReportGraceMs = 1000;

// The job's spares that registered and wait for a place.
static int count_ready_spares(const Job& job) {
  return static_cast<int>(
      std::count_if(job.spares.begin(), job.spares.end(), [](const Spare& v) { return v.ready; }));
}

std::string CoordinatorState::checkpoint_root(const Job& job) const {
  return job.request.checkpoint_dir.empty() ? job.run_dir + "/ckpt" : job.request.checkpoint_dir;
}

void CoordinatorState::on_failure(Job& job, FailureCause cause, const std::string& message, int rank,
                                  Actions* out, bool rank_stays) {
  if (is_terminal(job.state) || job.state == JobState::recovering) return;
  job.peer_report.reset();
  if (!job.stepped && job.memory_step >= 0) {
    job.memory_failed = true;
    job.memory_failed_why = std::string(to_string(cause)) + ": " + message;
  }
  const std::string name = to_string(cause);
  // Judged on the failures before this one.
  const FailureVerdict verdict = judge_failure(job, cause, message);
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
  int more = 0;
  f["ranks_where"] = where_groups(job.ranks, &more);
  if (more > 0) f["ranks_where_more"] = more;
  f["time_ms"] = now_ms();
  f["before_first_step"] = !job.stepped;
  job.failures.push_back(f);
  if (job.failures.size() > 32) job.failures.erase(job.failures.begin());
  out->events.push_back(f);

  if (!verdict.restart) {
    fail(job, cause, verdict.message, out);
    return;
  }
  ++job.restarts;
  job.crash_streak = job.stepped ? 1 : job.crash_streak + 1;
  // The other ranks' processes stay for the next generation; the failed rank's is killed.
  keep_survivors(job, rank_stays ? -1 : rank);
  // The backoff keeps a crash loop from starting processes over and over. A generation that
  // trained, whose every place the survivors and ready spares can fill, starts none: it
  // relaunches as soon as its survivors have reported (try_relaunch).
  const int ready_spares = count_ready_spares(job);
  const bool no_process_start = job.stepped && !job.request.auto_plan && job.target_dp == 0 &&
                                static_cast<int>(job.survivors.size()) + ready_spares >= job.layout.world();
  const double backoff =
      no_process_start ? 0 : restart_backoff_ms(job.request.restart_backoff_ms, job.crash_streak);
  // Every survivor aborts its communicators now, so none waits for a timeout.
  end_generation(job, JobState::recovering,
                 name + ": " + message + "; restart " + std::to_string(job.restarts) + " of " +
                     std::to_string(job.request.max_restarts),
                 "generation " + std::to_string(job.generation) + " aborted: " + name, now_ms() + backoff,
                 out);
}

void CoordinatorState::wait_for_devices(Job& job, double now, const std::string& why, Actions* out) {
  if (now >= job.recovery_deadline_ms) {
    fail(job, FailureCause::no_devices, why, out);
    return;
  }
  job.reason = why;
  tell_waiting(job, "recovering", now, out);
}

// `status` says the latest reason at once; the event tells a change at most once a second:
// each agent that comes or goes changes the count of free devices (517 events in one wait at
// 4,096 ranks), and the tick (every 100 ms) tells the last one within the second.
void CoordinatorState::tell_waiting(Job& job, const char* state, double now, Actions* out) {
  if (job.reason == job.waiting_told) return;
  if (!job.waiting_told.empty() && now < job.waiting_told_ms + kWaitingEventMs) return;
  job.waiting_told = job.reason;
  job.waiting_told_ms = now;
  out->events.push_back({{"event", "waiting"}, {"job", job.id}, {"state", state}, {"reason", job.reason}});
}

void CoordinatorState::try_relaunch(Job& job, double now, Actions* out) {
  if (job.state != JobState::recovering || now < job.relaunch_at_ms) return;
  if (job.request.auto_plan) {
    // The planner may choose another layout: nobody keeps a place.
    drop_survivors(
        job, [](const Survivor&) { return true; }, "an auto job is planned again", out);
    return relaunch_auto(job, now, out);
  }
  const int unit = job.layout.pp * job.layout.tp;
  int want = job.target_dp > 0 ? job.target_dp : job.layout.dp;
  // The survivors' and the ready spares' devices count: they are the job's own.
  const int ready_spares = count_ready_spares(job);
  int free_devices =
      registry_.free(job.request.device_kind) + static_cast<int>(job.survivors.size()) + ready_spares;
  int d = fit_data_size(job, want, free_devices);
  if (d == 0)
    return wait_for_devices(job, now,
                            "waiting for devices: " + std::to_string(free_devices) + " " +
                                job.request.device_kind + " free, the job needs " +
                                std::to_string(min_devices(job)) +
                                " (a multiple of pipeline x tensor = " + std::to_string(unit) + ")",
                            out);
  if (d == job.layout.dp && !job.survivors.empty()) {
    // Same layout: each survivor keeps its place. One that has not reported the end of its
    // generation yet gets a moment more, then is replaced like the failed rank.
    const bool all_parked =
        std::all_of(job.survivors.begin(), job.survivors.end(), [](const Survivor& v) { return v.parked; });
    if (!all_parked && now < job.relaunch_at_ms + kSurvivorReportMs) return;
    drop_survivors(
        job, [](const Survivor& v) { return !v.parked; },
        "it did not report the end of its generation in time", out);
  } else {
    drop_survivors(
        job, [](const Survivor&) { return true; },
        "the layout changes: " + job.layout.str() + " -> " + std::to_string(d) + "x" +
            std::to_string(job.layout.pp) + "x" + std::to_string(job.layout.tp),
        out);
  }
  // The survivors' places, ready spares in the places of the ranks that failed, and new
  // devices for the rest.
  std::vector<DeviceRef> devices(size_t(d * unit));
  std::vector<bool> taken(size_t(d * unit), false);
  int need = d * unit;
  for (const Survivor& v : job.survivors)
    if (v.rank < d * unit) {
      devices[size_t(v.rank)] = v.device;
      taken[size_t(v.rank)] = true;
      --need;
    }
  need -= place_spares(job, devices, taken, need);
  if (need > 0) {
    std::string why;
    // Spread: the new places go to the agents that hold the fewest of the job's ranks.
    std::map<std::string, int> held;
    for (int r = 0; r < d * unit; ++r)
      if (taken[size_t(r)]) ++held[devices[size_t(r)].agent_id];
    auto fresh = registry_.allocate(job.id, job.request.device_kind, need, &why, job.request.spread, held);
    if (!fresh) {
      for (Spare& v : job.spares) v.rank = -1;
      return;
    }
    size_t next = 0;
    for (int r = 0; r < d * unit; ++r)
      if (!taken[size_t(r)] && next < fresh->size()) devices[size_t(r)] = (*fresh)[next++];
  }
  const Layout from = job.layout;
  job.layout.dp = d;
  job.target_dp = 0;
  relaunch_from_checkpoint(job, from, devices, out);
  replenish_spares(job, out);
}

void CoordinatorState::relaunch_auto(Job& job, double now, Actions* out) {
  // The planner again, for the devices there are now: tensor and pipeline may change too.
  const int free = registry_.free(job.request.device_kind);
  const int n = auto_devices(job, free);
  std::string why;
  std::optional<Job::Choice> c;
  if (n < auto_min_devices(job) || n > free)
    why = "waiting for devices: " + std::to_string(free) + " " + job.request.device_kind +
          " free, the job needs " +
          (job.target_devices > 0 ? std::to_string(job.target_devices) + " (a resize)"
                                  : std::to_string(auto_min_devices(job)) + " or more");
  else
    c = plan_auto(job, n, &why);
  std::optional<std::vector<DeviceRef>> devices;
  if (c)
    devices =
        registry_.allocate(job.id, job.request.device_kind, c->layout.world(), &why, job.request.spread);
  if (!devices) return wait_for_devices(job, now, why, out);
  const Layout from = job.layout;
  job.layout = c->layout;
  job.target_devices = 0;
  job.choice = std::move(c);
  relaunch_from_checkpoint(job, from, *devices, out);
}

// N of a checkpoint directory ".../step_<N>" (the step it continues with); -1 for none.
static int64_t checkpoint_step(const std::string& dir) {
  const auto p = dir.rfind("step_");
  if (p == std::string::npos || p + 5 >= dir.size()) return -1;
  int64_t n = 0;
  for (size_t i = p + 5; i < dir.size(); ++i) {
    if (dir[i] < '0' || dir[i] > '9' || n > (int64_t(1) << 50)) return -1;
    n = n * 10 + (dir[i] - '0');
  }
  return n;
}

// Whether every rank can continue from the in-memory snapshots of step n: each survivor holds
// its own, and each rank started anew receives its buddy's copy or a data-parallel replica's
// (the lowest surviving rank of its group sends its state to the whole group). Fills
// job.heal_from_buddy and job.heal_roots, or says in `why` what is missing.
static bool heal_plan(Job& job, int64_t n, std::string* why) {
  const Layout& l = job.layout;
  const int world = l.world();
  job.heal_roots.assign(size_t(world), -1);
  job.heal_from_buddy.assign(size_t(world), 0);
  std::vector<const Survivor*> by_rank(size_t(world), nullptr);
  for (const Survivor& v : job.survivors) {
    if (v.rank < 0 || v.rank >= world) continue;
    if (std::find(v.memory.snapshots.begin(), v.memory.snapshots.end(), n) == v.memory.snapshots.end()) {
      *why = "rank " + std::to_string(v.rank) + " no longer holds step " + std::to_string(n);
      return false;
    }
    by_rank[size_t(v.rank)] = &v;
  }
  // Every rank that cannot be healed is looked at: a lost buddy, the reason no later step
  // could undo, is named before a copy merely missing (it may have been in flight).
  std::string missing, lost;
  for (int r = 0; r < world; ++r) {
    if (by_rank[size_t(r)]) continue;
    std::string buddy_why = "no buddies";
    bool buddy_lost = false;
    if (job.buddy_shift > 0) {
      const int h = BuddyRing{world, job.buddy_shift}.buddy(r);
      const Survivor* holder = by_rank[size_t(h)];
      if (holder && holder->memory.copies_of == r &&
          std::find(holder->memory.copies.begin(), holder->memory.copies.end(), n) !=
              holder->memory.copies.end()) {
        job.heal_from_buddy[size_t(r)] = 1;
        continue;
      }
      buddy_why = holder ? "its buddy, rank " + std::to_string(h) +
                               ", holds no copy of its snapshot of step " + std::to_string(n)
                         : "its buddy, rank " + std::to_string(h) + ", failed too (lost buddy)";
      buddy_lost = !holder;
    }
    const int t = r % l.tp, p = (r / l.tp) % l.pp;
    int root = -1;
    bool replica_survived = false;
    for (int d = 0; d < l.dp && root < 0; ++d) {
      const int q = (d * l.pp + p) * l.tp + t;
      if (!by_rank[size_t(q)]) continue;
      replica_survived = true;
      if (by_rank[size_t(q)]->memory.replicated) root = q;
    }
    if (root < 0) {
      std::string& slot = buddy_lost ? lost : missing;
      if (slot.empty())
        slot = "rank " + std::to_string(r) + ": " + buddy_why + ", and " +
               (l.dp == 1           ? "no data-parallel replica to receive its state from"
                : !replica_survived ? "no data-parallel replica survived"
                                    : "its data-parallel replicas hold sharded state (train.zero)");
      continue;
    }
    for (int d = 0; d < l.dp; ++d) job.heal_roots[size_t((d * l.pp + p) * l.tp + t)] = root;
  }
  if (lost.empty() && missing.empty()) return true;
  *why = lost.empty() ? missing : lost;
  return false;
}

void CoordinatorState::plan_memory_resume(Job& job, int64_t disk_step, Actions* out) {
  job.memory_step = -1;
  job.heal_roots.assign(size_t(job.layout.world()), -1);
  job.heal_from_buddy.assign(size_t(job.layout.world()), 0);
  if (job.survivors.empty()) return;
  auto no = [&](const std::string& why) {
    job.heal_roots.assign(size_t(job.layout.world()), -1);
    job.heal_from_buddy.assign(size_t(job.layout.world()), 0);
    out->events.push_back({{"event", "log"},
                           {"job", job.id},
                           {"message", "in-memory snapshots not used: " + why + "; resuming from " +
                                           (job.resume_from.empty() ? "scratch" : job.resume_from)}});
  };
  if (job.memory_failed)
    return no("the last generation that resumed from them failed before its first step (" +
              job.memory_failed_why + ")");
  // The newest step every rank completed: the last one every rank reported, and no newer
  // than any survivor's newest snapshot. Each holds two: the one before it may still be whole
  // everywhere when a copy of the newest was in flight.
  int64_t n = job.last_step + 1;
  for (const Survivor& v : job.survivors) {
    if (v.memory.snapshots.empty())
      return no("rank " + std::to_string(v.rank) + " holds none (checkpoint.memory_every 0, or a GPU rank)");
    n = std::min(n, *std::max_element(v.memory.snapshots.begin(), v.memory.snapshots.end()));
  }
  std::string why;
  for (const int64_t step : {n, n - 1}) {
    if (step < disk_step) {
      if (why.empty()) why = "the checkpoint on disk is newer (step " + std::to_string(disk_step) + ")";
      break;
    }
    std::string w;
    if (step >= 0 && heal_plan(job, step, &w)) {
      job.memory_step = step;
      int from_buddy = 0;
      for (char b : job.heal_from_buddy) from_buddy += b ? 1 : 0;
      out->events.push_back(
          {{"event", "log"},
           {"job", job.id},
           {"message", "resuming from in-memory snapshots of step " + std::to_string(step) +
                           " (the checkpoint on disk is of step " + std::to_string(disk_step) + ")" +
                           (from_buddy > 0 ? "; " + std::to_string(from_buddy) +
                                                 " rank(s) receive their state from their buddy"
                                           : "")}});
      return;
    }
    if (why.empty()) why = w;
  }
  no(why);
}

// Whether each rank of the job has a data-parallel replica on another agent than its own (or the
// job sits on one agent, where no copy outlives the agent anyway).
static bool replicas_elsewhere(const Job& job) {
  const Layout& l = job.layout;
  const int n = l.world();
  bool one_agent = true;
  for (int r = 1; r < n && one_agent; ++r)
    one_agent = job.ranks[size_t(r)].device.agent_id == job.ranks[0].device.agent_id;
  if (one_agent) return true;
  for (int r = 0; r < n; ++r) {
    const int in_replica = r % (l.pp * l.tp);
    bool elsewhere = false;
    for (int d = 0; d < l.dp && !elsewhere; ++d) {
      const int q = d * l.pp * l.tp + in_replica;
      elsewhere = q != r && job.ranks[size_t(q)].device.agent_id != job.ranks[size_t(r)].device.agent_id;
    }
    if (!elsewhere) return false;
  }
  return true;
}

// The shift of the buddy ring (worker/snapshot_buddy.hpp) for the job's placement: the first
// whose every buddy sits on another agent and outside its rank's tied-embedding group, else the
// first on another agent, else 1 (one agent).
//
// 0 (no copies) for a replicated job (train.zero 0, data >= 2) whose ranks each have a replica
// on another agent: the replicas' own snapshots are the copies, bit for bit, and a new rank heals
// from one (heal_plan), so copying each state to a buddy as well would only cost a transfer of
// it every step. (A spread placement can put every replica of a rank on its agent: then buddies.)
static int choose_buddy_shift(const Job& job) {
  const int n = job.layout.world();
  if (!job.request.memory_snapshots || n < 2 || static_cast<int>(job.ranks.size()) != n) return 0;
  if (job.request.replicated && job.layout.dp >= 2 && replicas_elsewhere(job)) return 0;
  // A tied embedding lives on the first and the last stage of each pipeline (plan/grid.hpp:
  // rank = (d * pp + p) * tp + t).
  const Layout& l = job.layout;
  std::vector<std::vector<int>> emb(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int t = r % l.tp, p = (r / l.tp) % l.pp, d = r / (l.tp * l.pp);
    if (l.pp > 1 && (p == 0 || p == l.pp - 1))
      emb[size_t(r)] = {d * l.pp * l.tp + t, (d * l.pp + l.pp - 1) * l.tp + t};
  }
  int best = 1, best_score = -1;
  for (int s = 1; s < n && best_score < 3; ++s) {
    bool other_agent = true, outside = true;
    for (int r = 0; r < n && (other_agent || outside); ++r) {
      const int q = BuddyRing{n, s}.buddy(r);
      if (job.ranks[size_t(r)].device.agent_id == job.ranks[size_t(q)].device.agent_id) other_agent = false;
      const auto& g = emb[size_t(r)];
      if (std::find(g.begin(), g.end(), q) != g.end()) outside = false;
    }
    const int score = (other_agent ? 2 : 0) + (outside ? 1 : 0);
    if (score > best_score) {
      best = s;
      best_score = score;
    }
  }
  return best;
}

void CoordinatorState::choose_buddies(Job& job) {
  // The copies held follow the ring: it changes only where no copy is used.
  if (job.memory_step < 0) job.buddy_shift = choose_buddy_shift(job);
}

void CoordinatorState::relaunch_from_checkpoint(Job& job, const Layout& from,
                                                const std::vector<DeviceRef>& devices, Actions* out) {
  std::vector<std::string> skipped;
  if (before_checkpoint_pick_) before_checkpoint_pick_(job.id);
  std::string ckpt = find_checkpoint_(checkpoint_root(job), &skipped);
  for (const auto& s : skipped)
    out->events.push_back({{"event", "log"}, {"job", job.id}, {"message", "checkpoint skipped: " + s}});
  job.resume_from = ckpt.empty() ? job.request.resume_from : ckpt;
  plan_memory_resume(job, checkpoint_step(job.resume_from), out);
  nlohmann::json kept = nlohmann::json::array(), spares = nlohmann::json::array();
  for (const Survivor& v : job.survivors) kept.push_back(v.rank);
  for (const Spare& v : job.spares)
    if (v.rank >= 0) spares.push_back({{"rank", v.rank}, {"pid", v.pid}});
  out->events.push_back({{"event", "relaunch"},
                         {"job", job.id},
                         {"generation", job.generation},
                         {"from_layout", from.str()},
                         {"layout", job.layout.str()},
                         {"resume_from", job.resume_from},
                         {"kept_ranks", kept},
                         {"spares_taking", spares},
                         {"memory_step", job.memory_step}});
  launch(job, devices, out);
}

void CoordinatorState::tick(double now, Actions* out) {
  for (const auto& id : order_) {
    Job& j = jobs_.at(id);
    if (j.state == JobState::recovering) {
      try_relaunch(j, now, out);
      continue;
    }
    if (j.state == JobState::queued) {
      tell_waiting(j, "queued", now, out);
      continue;
    }
    if (j.peer_report && now >= j.peer_report->at_ms + kPeerReportGraceMs &&
        (j.state == JobState::running || j.state == JobState::launching)) {
      const Job::PeerReport p = *j.peer_report;
      on_failure(j, p.cause, p.message, p.rank, out, true);
      continue;
    }
    if (j.state != JobState::running || j.last_progress_ms <= 0) continue;
    double limit = step_timeout_ms(j);
    if (now - j.last_progress_ms <= limit) continue;
    // Blame the hung rank: the one whose answer to "where are you" went stale while the
    // others still answer (a stopped process cannot); else the first unfinished one. Its
    // process is replaced, the others may stay. Every rank's op is in the message.
    std::string detail;
    int rank = -1;
    double newest = 0;
    for (const RankSlot& s : j.ranks)
      if (!s.done) newest = std::max(newest, s.where_ms);
    int stale = -1;
    size_t polled = 0;  // the ranks the coordinator asks in turn, every job's
    for (const auto& [other_id, other] : jobs_)
      if (other.state == JobState::running || other.state == JobState::launching)
        polled += other.ranks.size();
    const double stale_ms = kStaleWhereRounds * where_round_ms(polled);
    for (size_t r = 0; r < j.ranks.size(); ++r) {
      const RankSlot& s = j.ranks[r];
      if (s.done || newest - s.where_ms <= stale_ms) continue;
      if (stale < 0 || s.where_ms < j.ranks[stale].where_ms) stale = static_cast<int>(r);
    }
    for (size_t r = 0; r < j.ranks.size(); ++r) {
      const RankSlot& s = j.ranks[r];
      if (s.done) continue;
      if (rank < 0) rank = stale >= 0 ? stale : static_cast<int>(r);
      detail += (detail.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " (pid " +
                std::to_string(s.pid) + " on " + s.host + "): " + (s.where.empty() ? "?" : s.where);
    }
    char buf[96];
    std::snprintf(buf, sizeof buf, "no step completed for %.1f s (limit %.1f s); ",
                  (now - j.last_progress_ms) / 1000.0, limit / 1000.0);
    on_failure(j, FailureCause::step_timeout, buf + detail, rank, out);
  }
}

double CoordinatorState::step_timeout_ms(const Job& job) const {
  return coord::step_timeout_ms(job.request, job.step_ms);
}

bool CoordinatorState::scale(const std::string& job_id, int devices, Actions* out, std::string* why) {
  Job* j = find(job_id);
  std::string no = !j ? "unknown job '" + job_id + "'"
                   : j->request.auto_plan
                       ? auto_resize_refusal(*j, devices, registry_.free(j->request.device_kind))
                       : resize_refusal(*j, devices, registry_.free(j->request.device_kind));
  if (!no.empty()) {
    if (why) *why = no;
    return false;
  }
  const int64_t at = drain_step(*j);
  j->drain_step = at;
  if (j->request.auto_plan)
    j->target_devices = devices;  // the next launch plans for exactly these
  else
    j->target_dp = devices / (j->layout.pp * j->layout.tp);
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
    const int free = registry_.free(j.request.device_kind);
    int devices = 0;
    if (j.request.auto_plan) {
      // Planning is not free: ask again only when the free devices changed.
      if (free == j.grow_checked_free) continue;
      j.grow_checked_free = free;
      devices = auto_grow_devices(j, free);
    } else if (int d = grow_data_size(j, free); d > 0) {
      devices = d * j.layout.pp * j.layout.tp;
    }
    if (devices == 0) continue;
    // Free devices go to a queued job of the same kind first.
    bool someone_waits = false;
    for (const auto& [qid, q] : jobs_)
      someone_waits =
          someone_waits || (q.state == JobState::queued && q.request.device_kind == j.request.device_kind);
    if (someone_waits) continue;
    std::string why;
    scale(j.id, devices, out, &why);  // a job too close to its end just finishes
  }
}

}  // namespace troupe::coord
